"""TL1 as the emulated switches speak it, both dialects: cutting input into commands, parsing one command,
and framing what the switch sends (Telcordia GR-831 style; sources in docs/protocols.md §8).

Input:   VERB[-MOD1[-MOD2]]:[TID]:[AID]:[CTAG][:[GB][:payload]...];
         e.g. `ENT-PATCH::1,17:123:;`, `RTRV-EQPT::SYSTEM:5:::PARAMETER=SIZE;`, `RTRV-NE;`
Output:  \\r\\n\\n   <SID> <YY-MM-DD> <HH:MM:SS>\\r\\nM  <CTAG> COMPLD|DENY\\r\\n   <line>\\r\\n...;
Ack:     IP <CTAG>\\r\\n<        (the command is in progress and will take more than a few seconds)
Autonomous: the same header, then `<almcde> <ATAG> REPT ALM` instead of the M line.

Choices where the sources are silent (each is the emulator's, not a vendor's):
- a line break ends a command left open without its `;`: it is denied (IISP) rather than joined with the
  next line, so a client that forgot the `;` gets an answer instead of silence;
- a quoted string ends at a line break too (a stray `"` in garbage must not swallow every later `;`);
- an empty CTAG is answered as CTAG `0`, as a Calient does for `RTRV-NE;` (Quali's recorded replies);
- only printable ASCII is accepted inside a command; anything else is denied (IISP).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

MAX_COMMAND = 64 * 1024  # a client streaming bytes without a `;` must not eat the twin's memory
MAX_LIST = 65536  # `1&&999999999` must not allocate a billion ports
_CTAG = re.compile(r"[A-Za-z0-9]{1,6}")
_VERB = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+){0,2}")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_NUMBER_LIST = re.compile(r"\d{1,9}(?:&&\d{1,9})?(?:&\d{1,9}(?:&&\d{1,9})?)*")
_LIST_ITEM = re.compile(r"(\d+)(?:&&(\d+))?")
_FRAMING = re.compile(r'[;"\\\r\n]')  # the only characters the input framer looks at

# The error codes the emulators send, with the meaning the DENY comment starts with (generic TL1 codes:
# Symmetricom TimeProvider and ADTRAN MX2800 TL1 manuals, see docs/protocols.md).
ERROR_CODES = {
    "ICNV": "command not valid",
    "IIAC": "invalid access identifier",
    "IICT": "invalid correlation tag",
    "IITA": "invalid target identifier",
    "IISP": "invalid syntax or punctuation",
    "IDNV": "data not valid",
    "IPNV": "parameter not valid",
    "IPMS": "parameter missing",
    "INUP": "unimplemented non-null parameter",
    "PIUI": "input user not valid",
    "PLNA": "login not active",
    "SNVS": "not in valid state",
}


class Tl1Error(Exception):
    """A command the switch denies: the 4-letter code and a short text for the DENY comment."""

    def __init__(self, code: str, text: str = "", ctag: str | None = None) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text or ERROR_CODES.get(code, "")
        self.ctag = ctag  # set once known, so the DENY carries the client's CTAG


@dataclass(frozen=True)
class Command:
    verb: str  # upper case, e.g. "ENT-PATCH"
    tid: str
    aid: str
    ctag: str  # "0" when the client sent none
    blocks: tuple[str, ...]  # after the CTAG: the general block, then the payload blocks, raw

    def payload(self, index: int) -> str:
        """Payload block `index` (0 = the first block after the general block), "" if absent."""
        i = index + 1
        return self.blocks[i].strip() if i < len(self.blocks) else ""


# -- input ---------------------------------------------------------------------------------------


class CommandFramer:
    """Cuts the client's byte stream into commands at `;` (outside double quotes).

    feed() returns, in order, ("command", text) for each complete command (without its `;`),
    ("unterminated", text) for text a line break ended without a `;`, and ("overrun", "") when a command
    grew past MAX_COMMAND (its bytes are dropped up to the next `;` or line break). Bytes are read as
    latin-1, so any byte reaches the parser, which denies what is not ASCII.
    """

    def __init__(self, max_command: int = MAX_COMMAND) -> None:
        self.max_command = max_command
        self._buf: list[str] = []
        self._size = 0
        self._quoted = False
        self._escaped = False  # a backslash inside quotes: the next character is taken as it is
        self._discarding = False

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        text = data.decode("latin-1")
        out: list[tuple[str, str]] = []
        start = 0
        skip_at = 0 if self._escaped else -1  # the character after a backslash (it may start this chunk)
        self._escaped = False
        for m in _FRAMING.finditer(text):
            c, at = m.group(), m.start()
            if at == skip_at and c not in "\r\n":  # escaped; a line break is never escaped
                continue
            if c == "\\":
                if self._quoted:
                    skip_at = at + 1
                    self._escaped = skip_at == len(text)
                continue
            if c == '"':
                self._quoted = not self._quoted
                continue
            if c == ";" and self._quoted:
                continue
            # a `;` outside quotes, or a line break (which also ends a quoted string)
            self._take(text[start : m.start()], out)
            start = m.end()
            self._quoted = False
            if self._discarding:
                self._discarding = False
            elif c == ";":
                out.append(("command", "".join(self._buf)))
            elif "".join(self._buf).strip():
                out.append(("unterminated", "".join(self._buf)))
            self._buf, self._size = [], 0
        self._take(text[start:], out)
        return out

    def _take(self, piece: str, out: list[tuple[str, str]]) -> None:
        if self._discarding or not piece:
            return
        self._buf.append(piece)
        self._size += len(piece)
        if self._size > self.max_command:
            self._buf, self._size = [], 0
            self._discarding = True
            self._quoted = False
            out.append(("overrun", ""))


def split_outside_quotes(text: str, sep: str) -> list[str]:
    """Split on `sep` outside double-quoted strings (a backslash inside quotes escapes the next character)."""
    parts: list[str] = []
    start, quoted, i = 0, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\":
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quoted:
        raise Tl1Error("IISP", "a quoted string is not closed")
    parts.append(text[start:])
    return parts


def parse_command(text: str) -> Command:
    """One command without its `;`. Raises Tl1Error (with the CTAG when it could be read)."""
    text = text.strip(" \t\r\n")
    if not _PRINTABLE.fullmatch(text):
        raise Tl1Error("IISP", "only printable ASCII characters are accepted")
    blocks = split_outside_quotes(text, ":")
    fields = [b.strip() for b in blocks[:4]] + [""] * (4 - min(4, len(blocks)))
    verb, tid, aid, ctag = fields
    if not ctag:
        ctag = "0"
    elif not _CTAG.fullmatch(ctag):
        raise Tl1Error("IICT", "a CTAG is 1 to 6 letters or digits", ctag="0")
    if not _VERB.fullmatch(verb):
        raise Tl1Error("ICNV", "not a TL1 command verb", ctag=ctag)
    return Command(verb.upper(), tid, aid, ctag, tuple(blocks[4:]))


def unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def number_list(text: str, lo: int, hi: int) -> list[int]:
    """`3`, `1&2&7`, `1&&4` (a range, either way round) and mixtures; every number within lo..hi."""
    text = text.strip()
    if not _NUMBER_LIST.fullmatch(text):
        raise Tl1Error("IIAC", f"expected port numbers such as 1&2 or 1&&4, got {clip(text)!r}")
    ports: list[int] = []
    for item in _LIST_ITEM.finditer(text):
        a = int(item.group(1))
        b = int(item.group(2)) if item.group(2) else a
        if len(ports) + abs(b - a) + 1 > MAX_LIST:
            raise Tl1Error("IIAC", f"more than {MAX_LIST} ports in one list")
        ports.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    bad = [p for p in ports if not lo <= p <= hi]
    if bad:
        raise Tl1Error("IIAC", f"port {bad[0]} is not in {lo}..{hi}")
    return ports


def keywords(blocks: list[str]) -> dict[str, str]:
    """KEY=VALUE items of the payload blocks (upper-cased keys); a bare item is an error."""
    found: dict[str, str] = {}
    for block in blocks:
        for item in split_outside_quotes(block, ","):
            item = item.strip()
            if not item:
                continue
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise Tl1Error("IPNV", f"expected KEYWORD=VALUE, got {clip(item)!r}")
            found[key.strip().upper()] = unquote(value)
    return found


def clip(text: str, n: int = 40) -> str:
    """Text safe to send inside a comment: printable, short, no comment terminator and no `;` (clients such as
    Quali's take the first `;` for the end of the response, wherever it is).
    """
    text = "".join(c if " " <= c <= "~" else "?" for c in text).replace("*/", "*?").replace(";", ",")
    return text if len(text) <= n else text[: n - 3] + "..."


# -- output --------------------------------------------------------------------------------------


def header(sid: str, wall: float | None = None) -> str:
    stamp = time.strftime("%y-%m-%d %H:%M:%S", time.localtime(wall))
    return f"\r\n\n   {sid} {stamp}\r\n"


def quoted(text: str) -> str:
    """A quoted line of a response (no `;` ever goes into one: see clip)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def response(sid: str, ctag: str, lines: Iterable[str] = (), *, wall: float | None = None) -> bytes:
    """A COMPLD block; `lines` are sent as they are (quote them with quoted())."""
    body = "".join(f"   {line}\r\n" for line in lines)
    return (header(sid, wall) + f"M  {ctag} COMPLD\r\n" + body + ";").encode("ascii")


def deny(sid: str, ctag: str, code: str, text: str, *, wall: float | None = None) -> bytes:
    body = f"   {code}\r\n   /* {clip(text, 120)} */\r\n"
    return (header(sid, wall) + f"M  {ctag} DENY\r\n" + body + ";").encode("ascii")


def acknowledgment(ctag: str) -> bytes:
    return f"IP {ctag}\r\n<".encode("ascii")


def autonomous(sid: str, almcde: str, atag: int, verb: str, lines: list[str], *, wall: float | None = None) -> bytes:
    body = "".join(f"   {line}\r\n" for line in lines)
    return (header(sid, wall) + f"{almcde:<2} {atag} {verb}\r\n" + body + ";").encode("ascii")
