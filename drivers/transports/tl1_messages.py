"""TL1 output as messages: where a block ends, and what a block says. Pure: text in, messages out, no I/O.

TL1 (Telcordia GR-831 style, docs/protocols.md §8) is not line-oriented: a command ends with `;`,
and the switch's output is a stream of blocks, each ended by `;` (or `>` when more of the same response
follows, or `<` after an in-progress acknowledgment):

    \\r\\n\\n   <SID> <YY-MM-DD> <HH:MM:SS>\\r\\nM  <CTAG> COMPLD\\r\\n   "<line>"\\r\\n;      a response
    ...M  <CTAG> DENY\\r\\n   <ERRCODE>\\r\\n   /* <text> */\\r\\n;                          a refusal
    IP <CTAG>\\r\\n<                                                                   still working on it
    ...\\r\\n** <ATAG> REPT ALM\\r\\n   "<aid>:..."\\r\\n;                               autonomous

`Tl1Reader` cuts a stream into blocks and `parse_block` reads one; they, and `joined` for a response
continued over several blocks, are the only makers of a `Tl1Message`, so every message is one the parser read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_BUFFER = 1 << 20  # output without any block end in 1 MiB is not TL1
COMPLETION = ("COMPLD", "DENY", "PRTL", "DELAY", "RTRV")
_M_LINE = re.compile(r"^M\s+(\S+)\s+(" + "|".join(COMPLETION) + r")\s*$")
_HEADER = re.compile(r"^(.*?)\s*\d{2,4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*|A)\s+(\S+)\s+([A-Z][A-Z0-9-]*(?:\s+[A-Z0-9-]+)*)\s*$")
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+(\S+)\s*$")
_BLOCK_END = re.compile(r'[;"<>\n]|/\*|\*/')


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
        """The messages that `text` completes; ValueError once MAX_BUFFER characters hold no block end."""
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


def joined(parts: list[Tl1Message]) -> Tl1Message:
    """One response from the blocks it came in (each but the last ended by `>`): every part's lines, in order.

    The last part gives the CTAG, completion code and SID; a response in one block is returned as it is.
    """
    last = parts[-1]
    if len(parts) == 1:
        return last
    return Tl1Message(
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
