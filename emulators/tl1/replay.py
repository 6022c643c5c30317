"""Replaying a run's TL1 audit log through a fresh TL1 front end (`testbed replay`, testbed/ops/audit_replay.py).

The audit holds each command the driver sent as one tx record (`VERB:tid:aid:ctag:...;\\r\\n`, ACT-USER's password
masked as `***`) and the switch's output as rx records, raw chunks as they were read: a chunk may end in the
middle of a line or hold several blocks, with their `\\r\\n`, the `;` that ends each block, Calient's `agent>`
prompt, `IP <ctag>` / `<` acknowledgments and autonomous messages between them (docs/protocols.md §8.3).

How a recorded conversation is compared with the emulator's (Tl1Replay):

- Both sides are cut into blocks by the same reader and only final responses are compared, as the lines
  `M  <ctag> <COMPLD|DENY|...>` then each body line (quoted lines, error codes, comments) as `   <line>`.
  The CTAG stays: it says which command a response answers.
- The header line (`<SID> <YY-MM-DD> <HH:MM:SS>`) is left out: it says who answered and when, not what; a
  lab switch's SID is its configured name, the emulator's the inventory's. A GR-833 occurrence date and time
  inside a line (`...,<MM-DD>,<HH-MM-SS>,...` in alarm lines, §8.7) is masked for the same reason.
- In-progress acknowledgments (`IP <ctag>` and `<`, §8.3, §8.9) are left out: they only say that the
  COMPLD will take more than `ack_after_s`; when it came is the exchange's `at`, the time the emulator's
  COMPLD leaves.
- Autonomous messages (`REPT ALM`, §8.7) are left out of both sides: they answer no command; in a run
  they come from ports failed or restored through the twin's control API, which the audit does not hold, so
  the replayed front end never sends them, and their ATAG and occurrence time would differ anyway.
- ACT-USER is replayed with the twin's password in place of the masked one (the log cannot hold the run's
  password, so the replay assumes it was right: a login the switch refused for its password shows as a
  disagreement), and starts a new session, as the driver's transport only logs in on a new connection (or
  after the switch logged it out, DENY PLNA): a second login on the old session would be answered
  `/* Already logged in */` (§8.4).

Commands in flight together. The drivers send several commands before reading any answer (`send()` then
`collect()`, `check=False` writes; §8.9 "drivers"), so the answers to a batch are all recorded after its last
command: the replayer's group for each earlier command has no reply, and the last one's holds them all. The
session therefore keeps the emulator's answer to every command until the recording shows the switch's answer
to it: each exchange's lines are the emulator's answers to every command still waiting for its recorded one,
in the order sent, and recorded() gives the recorded answers to those commands, in the same order. A batch
is so compared once, in the group where the recording shows its answers (each answer's `M` line names its
CTAG); the earlier groups hold no recorded answer and are skipped. The emulator answers in the order of the
commands (§8.9) and the replay assumes the recorded switch did too: a command sent before one the switch has
answered, and not answered itself, never will be (the driver gave up waiting for it: a timeout). It leaves the
commands waiting (a late answer to it is not compared) and the group that shows it unanswered is "timing".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from emulators.frontends import twin_password
from emulators.scpi.replay import Exchange

# A response's first line after the header: `M  <ctag> <completion code>` (§8.3).
_M_LINE = re.compile(r"M\s+(\S+)\s+(COMPLD|DENY|PRTL|DELAY|RTRV)")
# An autonomous message's: `<alarm code> <atag> <verb...>`, alarm code *C, **, * or A (§8.3).
_AUTONOMOUS = re.compile(r"(?:\*C|\*\*|\*|A)\s+\S+\s+[A-Z][A-Z0-9-]*(?:\s+[A-Z0-9-]+)*")
# A GR-833 occurrence date and time inside a line: `<MM-DD>,<HH-MM-SS>` (§8.7).
_OCCURRED = re.compile(r"(?<![\d-])\d\d-\d\d,\d\d-\d\d-\d\d(?![\d-])")
# The ACT-USER as audited: its password replaced by `***` (testbed/results/redact.py's pattern, §8.4).
_MASKED_LOGIN = re.compile(r"(\s*ACT-USER:[^:;]*:[^:;]*:[^:;]*::)\*\*\*(?=;)", re.IGNORECASE)
_LOGIN = re.compile(r"\s*ACT-USER\s*:", re.IGNORECASE)


@dataclass
class Response:
    """A final response (its parts joined, should it come in several ended by `>`)."""

    ctag: str
    code: str
    body: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"M  {self.ctag} {self.code}", *(f"   {_OCCURRED.sub('MM-DD,HH-MM-SS', b)}" for b in self.body)]


class ResponseReader:
    """Cuts a switch's output, fed in chunks as they came, into its final responses.

    A block ends at `;` outside quoted strings and comments (§8.3); quotes and comments never span lines, so
    the line being read is kept and scanned again with the next chunk. Headers, acknowledgments, prompts and
    autonomous messages are read and dropped; a `>` alone on its line ends a part of a response whose next
    part (same CTAG) follows.
    """

    def __init__(self) -> None:
        self._pending = ""  # output after the last line break or `;`: a line not complete yet
        self._open: Response | None = None  # the response being read
        self._continued: Response | None = None  # a response whose last part ended with `>`
        self._autonomous = False  # reading an autonomous message (dropped)

    def feed(self, text: str) -> list[Response]:
        found: list[Response] = []
        text = self._pending + text
        start, quoted, comment, i = 0, False, False, 0
        while i < len(text):
            c = text[i]
            if c == "\n":
                self._line(text[start:i])
                start, quoted, comment = i + 1, False, False
            elif quoted:
                if c == "\\":
                    i += 1
                elif c == '"':
                    quoted = False
            elif comment:
                if text.startswith("*/", i):
                    comment, i = False, i + 1
            elif c == '"':
                quoted = True
            elif text.startswith("/*", i):
                comment, i = True, i + 1
            elif c == ";":
                self._line(text[start:i])
                start = i + 1
                self._end(found)
            i += 1
        self._pending = text[start:]
        return found

    def _line(self, line: str) -> None:
        line = line.strip()
        if self._open is not None:
            if line == ">":  # more of this response follows in a block of its own
                self._continued, self._open = self._open, None
            elif line:
                self._open.body.append(line)
            return
        if self._autonomous:
            return
        m = _M_LINE.fullmatch(line)
        if m:
            ctag, code = m.groups()
            if self._continued is not None and self._continued.ctag == ctag:
                self._open, self._continued = self._continued, None
                self._open.code = code
            else:
                self._open = Response(ctag, code)
        elif _AUTONOMOUS.fullmatch(line):
            self._autonomous = True
        # anything else outside a block: a header, `IP <ctag>` and its `<`, a prompt, an echo

    def _end(self, found: list[Response]) -> None:
        if self._open is not None:
            found.append(self._open)
        self._open, self._autonomous = None, False


@dataclass
class _Waiting:
    """A command the emulator answered and whose recorded answer has not been seen yet."""

    ctag: str
    lines: list[str]


class Tl1Replay:
    """The TL1 front ends' replay session (emulators/scpi/replay.py's interface), on a front end built without
    any server: a Tl1Session is fed each recorded command and what it sends is collected.
    """

    def __init__(self, frontend: Any) -> None:  # an emulators.tl1.frontend.Tl1Frontend (which imports this)
        self.frontend = frontend
        self._sent: list[tuple[float, bytes]] = []  # what the session sent during the current exchange
        self._session: Any = None  # its Tl1Session
        self._emulated = ResponseReader()
        self._recorded = ResponseReader()
        self._waiting: list[_Waiting] = []  # in the order sent
        self._given_up: set[str] = set()  # CTAGs the switch never answered in time: late answers are dropped
        self._connect()

    def _connect(self) -> None:
        """A new connection: a session not logged in; what was in flight on the old one is never answered."""
        if self._session is not None:
            self.frontend.sessions.discard(self._session)
        self._session = self.frontend.new_session(
            lambda at, data: self._sent.append((at, data)), lambda data: self._sent.append((float("-inf"), data))
        )
        self._emulated = ResponseReader()
        self._recorded = ResponseReader()
        self._given_up |= {w.ctag for w in self._waiting}
        self._waiting = []

    def exchange(self, message: str, now: float) -> Exchange:
        if _LOGIN.match(message):
            self._connect()
            message = _MASKED_LOGIN.sub(lambda m: m.group(1) + twin_password(), message, count=1)
        self._sent = []
        assert self._session is not None
        self._session.receive(message.encode("latin-1", errors="replace"), now)
        at = now
        for when, data in self._sent:
            for response in self._emulated.feed(data.decode("latin-1")):
                self._waiting.append(_Waiting(response.ctag, response.lines()))
                at = max(at, when)  # acknowledgments and alarms go at once; the response when complete
        self._sent = []
        return Exchange([line for w in self._waiting for line in w.lines], at)

    def recorded(self, text: str) -> list[str]:
        responses = self._recorded.feed(text)
        answered: dict[int, list[str]] = {}  # position in self._waiting -> the recorded answer's lines
        unasked: list[str] = []
        for response in responses:
            at = next((i for i, w in enumerate(self._waiting) if w.ctag == response.ctag and i not in answered), None)
            if at is not None:
                answered[at] = response.lines()
            elif response.ctag not in self._given_up:  # an answer to nothing the emulator was asked: show it
                unasked += response.lines()
        if answered:
            last = max(answered)
            # answered in order: those sent before the last answered one and not answered never will be
            self._given_up |= {w.ctag for i, w in enumerate(self._waiting[:last]) if i not in answered}
            self._waiting = self._waiting[last + 1 :]
        return [line for i in sorted(answered) for line in answered[i]] + unasked

    def verdict(self, message: str, recorded: list[str], emulated: list[str]) -> str:
        """Skip a group whose recording holds no answer: the driver sent its next command before reading one
        (the emulator's answer is carried on and compared in the group that shows the switch's), or asked for
        none (CANC-USER as it closes). "timing" when the recording holds answers but none to a command the
        emulator answered: the switch never answered it in time (the driver's timeout; or not yet, should a
        read have stopped short), so the group says when, not what. Else "compare", also when the switch
        answered a command the emulator did not (that answer is a disagreement).
        """
        if not recorded:
            return "skip"
        answered, emulated_ctags = _ctags(recorded), _ctags(emulated)
        if emulated_ctags - answered and answered <= emulated_ctags:
            return "timing"
        return "compare"


def _ctags(lines: list[str]) -> set[str]:
    return {m.group(1) for line in lines if line.startswith("M") and (m := _M_LINE.fullmatch(line))}
