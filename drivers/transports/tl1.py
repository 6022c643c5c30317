"""A TL1 client on a plain TCP socket: login, one unique CTAG per command, the response that carries it.

TL1 (Telcordia GR-831 style, docs/protocols.md §8) is not line-oriented: a command ends with `;`,
and the switch's output is a stream of blocks, each ended by `;` (or `>` when more of the same response
follows, or `<` after an in-progress acknowledgment):

    \\r\\n\\n   <SID> <YY-MM-DD> <HH:MM:SS>\\r\\nM  <CTAG> COMPLD\\r\\n   "<line>"\\r\\n;      a response
    ...M  <CTAG> DENY\\r\\n   <ERRCODE>\\r\\n   /* <text> */\\r\\n;                          a refusal
    IP <CTAG>\\r\\n<                                                                   still working on it
    ...\\r\\n** <ATAG> REPT ALM\\r\\n   "<aid>:..."\\r\\n;                               autonomous

Autonomous messages may arrive between any two blocks, and a response to an earlier command that timed out
may arrive late: the transport matches responses by CTAG, keeps autonomous messages aside (`autonomous`,
newest last) and drops the rest (after auditing it). Every byte sent and received is audited; the password
of ACT-USER never is (the audit gets `ACT-USER::<user>:<ctag>::***;`, testbed/results/redact.py's form).
"""

from __future__ import annotations

import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field

from drivers.audit import AuditSink, record
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.transports.tl1_settings import Tl1Settings

MAX_CTAG = 999_999  # CTAGs are 1 to 6 characters; this one counts 1..999999 and wraps
MAX_BUFFER = 1 << 20  # output without any block end in 1 MiB is not TL1
KEPT = 256  # autonomous messages kept for the caller
MAX_ACKS = 10  # each in-progress acknowledgment extends the wait by the timeout, this many times at most
COMPLETION = ("COMPLD", "DENY", "PRTL", "DELAY", "RTRV")
_M_LINE = re.compile(r"^M\s+(\S+)\s+(" + "|".join(COMPLETION) + r")\s*$")
_HEADER = re.compile(r"^(.*?)\s*\d{2,4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*|A)\s+(\S+)\s+([A-Z][A-Z0-9-]*(?:\s+[A-Z0-9-]+)*)\s*$")
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+(\S+)\s*$")
_BLOCK_END = re.compile(r'[;"<>\n]|/\*|\*/')
_UNSAFE = re.compile(r"[;:\r\n\"]")  # what a user name or password cannot carry in ACT-USER

# Generic TL1 error codes (Telcordia GR-833 appendix, as the Symmetricom and ADTRAN TL1 manuals list them).
MEANINGS = {
    "ICNV": "command not valid",
    "IIAC": "invalid access identifier (port)",
    "IICT": "invalid correlation tag",
    "IITA": "invalid target identifier",
    "IISP": "invalid syntax or punctuation",
    "IDNV": "data not valid",
    "IPNV": "parameter not valid",
    "IPMS": "parameter missing",
    "IPEX": "extra parameter",
    "INUP": "unimplemented non-null parameter",
    "PIUI": "input user not valid",
    "PICC": "invalid command code (login)",
    "PLNA": "login not active",
    "SNVS": "not in valid state",
    "SROF": "requested operation failed",
    "SARB": "system resources are busy",
    "ENEQ": "not equipped",
}
HINTS = {
    "IIAC": "a port (access identifier) is not one this switch has; check the port numbers",
    "SNVS": "a port or connection is in the wrong state (in use by another circuit, or not active): "
    "read connections() and disconnect first",
    "PLNA": "the session is not logged in (the switch may have logged it out): retry; if it persists, "
    "check the user's privileges on the switch",
    "PIUI": "check the user name in the inventory and the password",
    "SROF": "the switch failed the operation: look at its alarms (RTRV-ALM-ALL) and retry",
    "SARB": "the switch is busy: retry later",
    "IITA": "the target identifier does not name this switch: the driver sends none, so check the switch",
}
FORM_HINT = "the switch does not accept this command form; check its model and TL1 firmware version"


@dataclass(frozen=True)
class Tl1Message:
    """One block of output: a response (kind "response", its CTAG and completion code), an autonomous
    message ("autonomous": alarm code, ATAG, verb) or an acknowledgment ("ack": code, CTAG).
    """

    kind: str
    tag: str  # CTAG or ATAG
    code: str  # COMPLD / DENY / ..., the alarm code (*C ** * A), or the ack code (IP ...)
    verb: str = ""  # autonomous messages: e.g. "REPT ALM"
    sid: str = ""
    lines: tuple[str, ...] = ()  # quoted lines, unquoted
    words: tuple[str, ...] = ()  # lines neither quoted nor comments (a DENY's error code)
    comments: tuple[str, ...] = ()
    text: str = ""  # the raw block
    more: bool = False  # ended by `>`: more of this response follows
    content: tuple[str, ...] = ()  # every line that is not a comment, in order, unquoted if it was quoted


class Tl1Reader:
    """Cuts the switch's output into blocks and parses each; pure (no I/O), so it is fuzzed on its own.

    A block ends at `;` outside quoted strings and comments, at `>` alone on its line (more follows), or at
    `<` alone on the line after an acknowledgment (a `<` anywhere else is a prompt).
    Quotes and comments never span lines: a stray `"` in garbage cannot swallow the rest of the stream.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._scan = 0  # where the next scan starts; quote and comment state up to there
        self._quoted = False
        self._comment = False

    def feed(self, text: str) -> list[Tl1Message]:
        self._buf += text
        found: list[Tl1Message] = []
        while True:
            end, more = self._find_end()
            if end < 0:
                break
            block, self._buf = self._buf[:end], self._buf[end:]
            self._scan, self._quoted, self._comment = 0, False, False
            message = parse_block(block, more)
            if message is not None:
                found.append(message)
        if len(self._buf) > MAX_BUFFER:
            raise ValueError(f"{len(self._buf)} characters without the end of a TL1 block")
        return found

    @property
    def pending(self) -> str:
        """Output that has not ended a block yet."""
        return self._buf

    def _find_end(self) -> tuple[int, bool]:
        buf = self._buf
        scanned = self._scan
        for m in _BLOCK_END.finditer(buf, self._scan):
            mark, scanned = m.group(), m.end()
            if mark == "\n":
                self._quoted = self._comment = False
            elif self._quoted:
                if mark == '"' and not _escaped(buf, m.start()):
                    self._quoted = False
            elif self._comment:
                if mark == "*/":
                    self._comment = False
            elif mark == '"':
                self._quoted = True
            elif mark == "/*":
                self._comment = True
            elif mark == ";":
                return m.end(), False
            elif mark == ">" and _alone_on_line(buf, m.start()):
                return m.end(), True
            elif mark == "<" and _alone_on_line(buf, m.start()) and _after_ack(buf, m.start()):
                return m.end(), False
        # The first half of /* or */ may have arrived alone: look at it again with the next output.
        self._scan = len(buf) - 1 if scanned < len(buf) and buf[-1] in "/*" else len(buf)
        return -1, False


def _escaped(buf: str, at: int) -> bool:
    slashes = 0
    while at - slashes - 1 >= 0 and buf[at - slashes - 1] == "\\":
        slashes += 1
    return slashes % 2 == 1


def _after_ack(buf: str, at: int) -> bool:
    """`<` ends an acknowledgment (`IP <ctag>` on the line before); elsewhere it is a prompt, not an end."""
    before = buf[: buf.rfind("\n", 0, at) + 1].rstrip().rsplit("\n", 1)[-1]
    return bool(_ACK.match(before.strip()))


def _alone_on_line(buf: str, at: int) -> bool:
    start = buf.rfind("\n", 0, at) + 1
    return not buf[start:at].strip()


def parse_block(block: str, more: bool = False) -> Tl1Message | None:
    """A block of output as a message; None for output that is none (a prompt, an echo, noise)."""
    lines = [line.strip() for line in block.replace("\r", "\n").split("\n")]
    lines = [line for line in lines if line]
    if lines and lines[-1] in (";", "<", ">"):
        lines.pop()
    elif lines and lines[-1].endswith(";"):
        lines[-1] = lines[-1][:-1].rstrip()
    for at, line in enumerate(lines):
        m = _M_LINE.match(line)
        if m:
            sid = _sid(lines[at - 1]) if at else ""
            quoted, words, comments, content = _body(lines[at + 1 :])
            return Tl1Message(
                "response", m.group(1), m.group(2), "", sid, quoted, words, comments, block, more, content
            )
        m = _AUTONOMOUS.match(line)
        if m and (at == 0 or _HEADER.match(lines[at - 1])):
            sid = _sid(lines[at - 1]) if at else ""
            quoted, words, comments, content = _body(lines[at + 1 :])
            verb = " ".join(m.group(3).split())
            return Tl1Message(
                "autonomous", m.group(2), m.group(1), verb, sid, quoted, words, comments, block, False, content
            )
        m = _ACK.match(line)
        if m and block.rstrip().endswith("<"):
            return Tl1Message("ack", m.group(2), m.group(1), text=block)
    return None


def _sid(line: str) -> str:
    m = _HEADER.match(line)
    return m.group(1).strip() if m else ""


def _body(lines: list[str]) -> tuple[tuple[str, ...], ...]:
    quoted, words, comments, content = [], [], [], []
    for line in lines:
        if line.startswith('"') and line.endswith('"') and len(line) >= 2:
            quoted.append(re.sub(r"\\(.)", r"\1", line[1:-1]))
            content.append(quoted[-1])
        elif line.startswith("/*"):
            comments.append(line.removeprefix("/*").removesuffix("*/").strip())
        else:
            words.append(line)
            content.append(line)
    return tuple(quoted), tuple(words), tuple(comments), tuple(content)


class Tl1Denied(DeviceCommandError):
    """The switch answered DENY (or PRTL): `code` is its 4-letter error code, `response` the whole block."""

    def __init__(self, message: str, *, code: str, response: Tl1Message | None = None, **kwargs) -> None:
        self.code = code
        self.response = response
        super().__init__(message, **kwargs)

    def __reduce__(self):
        fields = (self.message, self.code, self.device, self.address, self.sent, self.received, self.hint)
        return (_rebuild_denied, fields)


def _rebuild_denied(message, code, device, address, sent, received, hint):
    return Tl1Denied(message, code=code, device=device, address=address, sent=sent, received=received, hint=hint)


@dataclass
class _Outstanding:
    """A command sent and not answered yet: what it was (as audited), its response so far."""

    shown: str  # the command as audited (the password masked)
    parts: list[Tl1Message] = field(default_factory=list)  # blocks of its response, the last one ended by `>`
    done: bool = False
    acks: int = 0  # in-progress acknowledgments (`IP <ctag>`) received for it
    acked_at: float = float("-inf")  # when the last one came


class Tl1Transport:
    """One TL1 session with one switch. Connects and logs in on first use; after a lost connection the next
    command connects again. Raises drivers.errors.DeviceError subclasses only.

    `command()` sends and waits for the answer. `send()` and `wait()` / `collect()` split the two, so several
    commands can be in flight at once (TL1's CTAGs exist for that): the switch executes them in order and
    their moves overlap, where waiting for each COMPLD would add up every switching time.
    """

    def __init__(self, settings: Tl1Settings, device: str, audit: AuditSink | None = None, *, hints=None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address  # user@host:port, as the inventory and the device actor name it
        self._where = f"{settings.host}:{settings.port}"
        self.hints = {**HINTS, **(hints or {})}  # a driver's own words for some error codes
        self.autonomous: deque[Tl1Message] = deque(maxlen=KEPT)
        self.last_sent: str | None = None  # the last command, as audited: for the drivers' error messages
        self._audit = audit
        self._sock: socket.socket | None = None
        self._reader = Tl1Reader()
        self._ctag = 0
        self._logged_in = False
        self._outstanding: dict[str, _Outstanding] = {}  # CTAG -> command, in the order sent

    # -- the interface the drivers use ------------------------------------------------------------------

    def command(self, verb: str, aid: str = "", *blocks: str, tid: str = "") -> Tl1Message:
        """Send `VERB:tid:aid:<ctag>[:block...];` and return its COMPLD response (continuations joined).

        Raises Tl1Denied for DENY/PRTL, DeviceTimeout, DeviceConnectionError, DeviceProtocolError.
        A DENY PLNA (the switch logged the session out, e.g. after its idle timeout) logs in again and sends
        the command once more: PLNA means it was not carried out.
        """
        try:
            return self.wait(self.send(verb, aid, *blocks, tid=tid))
        except Tl1Denied as err:
            if err.code != "PLNA":
                raise
        self._login()
        return self.wait(self.send(verb, aid, *blocks, tid=tid))

    def send(self, verb: str, aid: str = "", *blocks: str, tid: str = "") -> str:
        """Send a command without waiting for its answer; returns its CTAG for wait() or collect()."""
        self._connect()
        return self._send(verb, aid, blocks, tid)

    def wait(self, ctag: str) -> Tl1Message:
        """The COMPLD response to the command sent with `ctag`; raises as command() does (without retrying)."""
        command = self._outstanding.get(ctag)
        if command is None:
            raise ValueError(f"no command with CTAG {ctag} is waiting for its answer")
        received: list[str] = []
        start = time.monotonic()
        while not command.done:
            # an acknowledgment says the switch is working on it: wait on, from then (a bounded number of times)
            since = max(start, command.acked_at) if command.acks <= MAX_ACKS else start
            self._read(since + self.settings.timeout_s, command, ctag, received)
        del self._outstanding[ctag]
        return self._result(command)

    def collect(self, ctags: list[str]) -> list[Tl1Message | Tl1Denied]:
        """The answers to commands sent with send(), in order: a Tl1Denied for each refused one. Any other
        error (no answer, the connection lost) is raised, and the outcome of every command still in flight
        is then unknown: they are forgotten.
        """
        results: list[Tl1Message | Tl1Denied] = []
        try:
            for ctag in ctags:
                try:
                    results.append(self.wait(ctag))
                except Tl1Denied as err:
                    results.append(err)
        except DeviceError:
            for ctag in ctags:
                self._outstanding.pop(ctag, None)
            raise
        return results

    def close(self) -> None:
        sock, logged_in = self._sock, self._logged_in
        self._forget()
        if sock is None:
            return
        if logged_in:
            try:  # log out politely; the answer is not waited for
                line = f"CANC-USER::{self.settings.user}:{self._next_ctag()};"
                record(self._audit, self.device, self.address, "tx", line + "\r\n")
                sock.sendall((line + "\r\n").encode("ascii"))
            except OSError:
                pass
        sock.close()

    # -- connection and login ---------------------------------------------------------------------------

    def _connect(self) -> None:
        if self._sock is not None:
            return
        s = self.settings
        login = f"ACT-USER::{s.user}:<ctag>::<password>;"
        if s.password is None:
            raise self._error(
                DeviceConnectionError,
                f"no password to log in as {s.user!r} with, nothing was sent",
                hint=f"set the environment variable {s.password_env} to the password of user {s.user!r} on the switch"
                if s.password_env
                else f"give the driver the password of user {s.user!r} on the switch",
            )
        if _UNSAFE.search(s.user) or _UNSAFE.search(s.password):
            raise self._error(
                DeviceConnectionError,
                "the user name or password contains ; : \" or a line break, which TL1's ACT-USER cannot carry",
                hint="use a TL1 account whose name and password avoid those characters",
            )
        try:
            sock = socket.create_connection((s.host, s.port), timeout=s.timeout_s)
        except OSError as exc:
            raise self._error(
                DeviceConnectionError,
                f"cannot connect, nothing was sent: {exc}",
                sent=login,
                hint=f"nothing accepted the connection to {self._where}: check that the switch is on, the host "
                "and port in the inventory (Polatis TL1 listens on TCP 3082, Calient on 3083) and any firewall",
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small command, then wait for its answer
        self._sock = sock
        self._login()

    def _error(self, cls: type[DeviceError], message: str, **kw) -> DeviceError:
        """A device error of this switch: `kw` says what was sent and received, and what to try."""
        return cls(message, device=self.device, address=self.address, **kw)

    def _login(self) -> None:
        s = self.settings
        self._logged_in = False
        try:
            self.wait(self._send("ACT-USER", s.user, ("", s.password), "", masked=True))
            self._logged_in = True
        except Tl1Denied as err:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"the switch refused the login of user {s.user!r}: {err.code} ({MEANINGS.get(err.code, '?')})",
                sent=err.sent,
                received=err.received,
                hint="check the user name in the inventory and the password in "
                + (f"the environment variable {s.password_env}" if s.password_env else "the driver's settings"),
            ) from None
        except DeviceTimeout as err:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"no answer to the login within {s.timeout_s * 1000:.0f} ms",
                sent=err.sent,
                received=err.received,
                hint=f"is {self._where} a TL1 port (Polatis 3082, Calient 3083)? raise timeout_s if the switch is slow",
            ) from None
        except DeviceError:
            self._forget()
            raise

    def _next_ctag(self) -> str:
        self._ctag = self._ctag % MAX_CTAG + 1
        return str(self._ctag)

    # -- sending and receiving ------------------------------------------------------------------------

    def _send(self, verb: str, aid: str, blocks: tuple[str, ...], tid: str, *, masked: bool = False) -> str:
        assert self._sock is not None
        ctag = self._next_ctag()
        head = f"{verb}:{tid}:{aid}:{ctag}"
        line = head + "".join(":" + b for b in blocks) + ";"
        # ACT-USER's last block is the password: the audit and every error message get *** instead
        shown = head + "".join(":" + b for b in blocks[:-1]) + ":***;" if masked else line
        self.last_sent = shown
        record(self._audit, self.device, self.address, "tx", shown + "\r\n")
        try:
            data = (line + "\r\n").encode("ascii")
        except UnicodeEncodeError:
            raise self._error(
                DeviceProtocolError,
                "a command may only hold ASCII characters, nothing was sent",
                sent=shown,
                hint="this is a bug in the driver that built the command",
            ) from None
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"connection lost while sending: {exc}",
                sent=shown,
                hint="the switch closed or reset the connection; the next call reconnects and logs in again, but "
                "the outcome of this command is unknown",
            ) from exc
        self._outstanding[ctag] = _Outstanding(shown)
        return ctag

    def _read(self, deadline: float, command: _Outstanding, ctag: str, received: list[str]) -> None:
        """Read once (until `deadline`); file responses and acknowledgments under their commands."""
        data = self._recv(deadline, command, ctag, received)
        try:
            messages = self._reader.feed(data.decode("utf-8", errors="backslashreplace"))
        except ValueError as exc:
            self._forget()
            raise self._error(
                DeviceProtocolError,
                f"the output is not TL1: {exc}",
                sent=command.shown,
                received="".join(received)[-2000:],
                hint=f"is {self._where} the switch's TL1 port?",
            ) from None
        for message in messages:
            waiting = self._outstanding.get(message.tag)
            if message.kind == "autonomous":
                self.autonomous.append(message)
            elif waiting is None or waiting.done:
                continue  # an answer to a command no longer waited for (it timed out), or not ours
            elif message.kind == "ack":
                waiting.acks += 1
                waiting.acked_at = time.monotonic()
            else:
                waiting.parts.append(message)
                waiting.done = not message.more

    def _recv(self, deadline: float, command: _Outstanding, ctag: str, received: list[str]) -> bytes:
        assert self._sock is not None
        remaining = deadline - time.monotonic()
        fields = {"device": self.device, "address": self.address, "sent": command.shown}
        if remaining > 0:
            try:
                self._sock.settimeout(remaining)
                data = self._sock.recv(65536)
            except TimeoutError:
                data = None
            except OSError as exc:
                self._forget()
                raise DeviceConnectionError(
                    f"connection lost: {exc}",
                    received="".join(received) or None,
                    hint="the switch reset the connection; the next call reconnects, but the outcome of the "
                    "commands in flight is unknown",
                    **fields,
                ) from exc
            if data:
                record(self._audit, self.device, self.address, "rx", data)
                received.append(data.decode("utf-8", errors="backslashreplace"))
                return data
            if data == b"":
                self._forget()
                raise DeviceConnectionError(
                    "the switch closed the connection",
                    received="".join(received) or None,
                    hint="the switch ended the session (logged out, rebooted, or its idle timeout); the next call "
                    "reconnects, but the outcome of the commands in flight is unknown",
                    **fields,
                )
        self._outstanding.pop(ctag, None)
        raise DeviceTimeout(
            f"no response with CTAG {ctag} within {self.settings.timeout_s * 1000:.0f} ms",
            received="".join(received) or None,
            hint=f"check that {self._where} is the switch's TL1 port and the switch is responsive; raise "
            f"timeout_s in the inventory if it is slow (now {self.settings.timeout_s:g} s)",
            **fields,
        )

    def _forget(self) -> None:
        """Drop the connection and everything in flight on it."""
        self._logged_in = False
        sock, self._sock = self._sock, None
        self._reader = Tl1Reader()
        self._outstanding.clear()
        if sock is not None:
            sock.close()

    def _result(self, command: _Outstanding) -> Tl1Message:
        parts = command.parts
        last = parts[-1]
        if len(parts) > 1:  # a response continued with `>`: one message with every part's lines
            last = Tl1Message(
                "response",
                last.tag,
                last.code,
                sid=last.sid,
                lines=tuple(x for p in parts for x in p.lines),
                words=tuple(x for p in parts for x in p.words),
                comments=tuple(x for p in parts for x in p.comments),
                text="".join(p.text for p in parts),
                content=tuple(x for p in parts for x in p.content),
            )
        verb = command.shown.split(":", 1)[0]
        if last.code in ("COMPLD", "DELAY"):
            return last
        if last.code in ("DENY", "PRTL"):
            code = next((w for w in last.words if re.fullmatch(r"[A-Z]{4}", w)), last.words[0] if last.words else "")
            why = "; ".join(last.comments)
            outcome = "denied" if last.code == "DENY" else "partly carried out (PRTL)"
            raise self._error(
                Tl1Denied,
                f"the switch {outcome} {verb}: {code or '?'} ({MEANINGS.get(code, 'unknown error code')})"
                + (f": {why}" if why else ""),
                code=code,
                response=last,
                sent=command.shown,
                received=last.text.strip(),
                hint=self.hints.get(code, FORM_HINT),
            )
        raise self._error(
            DeviceProtocolError,
            f"unexpected completion code {last.code} for {verb}",
            sent=command.shown,
            received=last.text.strip(),
            hint="the driver expects COMPLD or DENY; check the switch's TL1 firmware version",
        )


def combined_refusals(errors: list[Tl1Denied], after: str, device: str, address: str) -> DeviceCommandError:
    """One error for several refusals (commands sent together, or with check=False before check_errors())."""
    if len(errors) == 1:
        return errors[0]
    first = errors[0]
    return DeviceCommandError(
        f"the switch refused {len(errors)} command(s) of {after}; the first: {first.message}",
        device=device,
        address=address,
        sent="\n".join(e.sent or "" for e in errors),
        received="\n".join(str(e.received) for e in errors),
        hint=first.hint,
    )
