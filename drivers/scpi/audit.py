"""The Polatis driver's own account of its SCPI: what the lines sent to a switch do to its circuits.

`testbed check` verifies a run from its audit log: it replays the lines sent to each switch to get the
circuits the switch should hold, and checks that no write touched a port the inventory forbids. It asks the
driver, which owns the protocol, never the emulator: production code must not depend on a test double, and
a checker built on the emulator's engine would agree with it by construction. tests/drivers/
test_polatis_audit.py holds the two, independent readings of one grammar, to each other by fuzzing.

Modelled is what decides the circuits: the command tree (short and long forms, any case, SCPI path memory
across the units of one line, so `:OXC:SWIT:CONN:ADD ...;SUB ...` is understood), splitting on ';' and ','
outside parentheses and quotes, channel lists with ranges, and that a refused command changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from drivers.audit import ALL_PORTS


@dataclass(frozen=True)
class Write:
    """One unit sent that names a command changing the switch, accepted or not: the audit is of intent.

    `ports` are the ports named where the switch reads ports (not range-checked, so a stray port shows
    up); for a unit the switch accepts they lie within 1..2*size. A unit whose parameters cannot be read
    names no port.
    """

    command: str
    ports: frozenset[int] | object


class _Refused(Exception):
    """The switch would refuse the unit (it queues an error and changes nothing)."""


class _Node:
    """One node of the command tree: matches its short or long form in any case (SWIT, switch...)."""

    def __init__(self, spelling: str) -> None:
        self.spelling = spelling
        self.suffixed = spelling.endswith("#")  # NETWork#: a numeric suffix may follow
        word = spelling.rstrip("#")
        self.long = word.upper()
        self.short = re.match(r"[A-Z0-9_]*", word).group(0) or self.long  # type: ignore[union-attr]  # `*` always matches
        self.children: list[_Node] = []
        self.write: _Command | None = None  # set on the nodes whose set form changes the switch

    def match(self, mnemonic: str) -> bool:
        word = mnemonic.upper()
        if self.suffixed and (m := re.fullmatch(r"(.*?)(\d{1,6})", word)):
            word = m.group(1)
        return word in (self.short, self.long)


# A write: its name, the fewest and most parameters the switch takes (other counts are refused), and how
# many leading ones are channel lists (a third ADD/ONLY/SUB parameter is accepted and ignored).
_Command = tuple[str, int, int, int]
_RST: _Command = ("*RST", 0, 0, 0)
_WRITES: dict[str, _Command] = {
    "OXC:SWITch:CONNect:ADD": ("ADD", 2, 3, 2),
    "OXC:SWITch:CONNect:ONLY": ("ONLY", 2, 3, 2),
    "OXC:SWITch:CONNect:SUB": ("SUB", 1, 3, 2),
    "OXC:SWITch:DISConnect:ALL": ("DISC:ALL", 0, 0, 0),
    "OXC:SWITch:PORT:DISable": ("PORT:DIS", 1, 1, 1),
    "OXC:SWITch:PORT:ENABle": ("PORT:ENAB", 1, 1, 1),
    "OXC:BOOT:MODE": ("BOOT:MODE", 1, 1, 0),  # what the switch restores at power-on: a write, no port
}
# The headers that only read are listed too: path memory lets `:OXC:SWIT:CONN:STAT?;ADD ...` reach ADD,
# so a relative header resolves only against the switch's whole tree (capitals: the short form).
_READS = """SYSTem:ERRor:NEXT SYSTem:ERRor:ALL SYSTem:ERRor:COUNt SYSTem:VERSion SYSTem:COMMunicate:NETWork#:ADDRess
    OXC:SWITch:SIZE OXC:SWITch:CONNect:STATe OXC:SWITch:CONNect:PORT OXC:SWITch:PORT:STATe PMON:POWer""".split()
_CLEARS_ALL = ("DISC:ALL", "*RST")


def _tree() -> _Node:
    root = _Node("")
    for header in [*_READS, *_WRITES]:
        node = root
        for spelling in header.split(":"):
            child = next((c for c in node.children if c.spelling == spelling), None)
            if child is None:
                node.children.append(child := _Node(spelling))
            node = child
        node.write = _WRITES.get(header)
    return root


_ROOT = _tree()
_HEADER_RE = re.compile(r":?[A-Za-z][A-Za-z0-9_]*(?::[A-Za-z][A-Za-z0-9_]*)*\??")
_COMMON_RE = re.compile(r"\*[A-Za-z]+\??")
_SPLIT_AT = {sep: re.compile(rf"[()'\"{sep}]") for sep in ";,"}  # the only characters splitting looks at
_CHANNEL_LIST_RE = re.compile(r"\(\s*@(.*)\)", re.S)
_PLAIN_CHANNELS_RE = re.compile(r"\s*\d{1,9}\s*(?:,\s*\d{1,9}\s*)*")
_CHANNEL_RE = re.compile(r"\d{1,9}")
MAX_CHANNELS = 65536  # the switch refuses longer lists; (@1:999999999) must not allocate a billion ints


def _split(text: str, sep: str) -> list[str]:
    """Split on `sep` outside parentheses and quoted strings (a doubled quote re-enters the string)."""
    parts, start, depth, quote = [], 0, 0, ""
    for m in _SPLIT_AT[sep].finditer(text):
        c = m.group()
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "()":
            depth = depth + 1 if c == "(" else max(0, depth - 1)  # a stray ')' does not go negative
        elif depth == 0:
            parts.append(text[start : m.start()])
            start = m.end()
    parts.append(text[start:])
    return parts


def _channels(text: str) -> list[int]:
    """`(@1,2,3)`, `(@ 1 , 2 )`, `(@)` and ranges `(@1:4)` / `(@4:1)`, duplicates kept, in order."""
    m = _CHANNEL_LIST_RE.fullmatch(text.strip())
    if not m:
        raise _Refused
    body = m.group(1).strip()
    if not body:
        return []
    if _PLAIN_CHANNELS_RE.fullmatch(body):  # no ranges: one regex checks every channel (256-port lists)
        if body.count(",") >= MAX_CHANNELS:
            raise _Refused
        return [int(item) for item in body.split(",")]
    ports: list[int] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition(":")
        if not _CHANNEL_RE.fullmatch(lo.strip()) or (sep and not _CHANNEL_RE.fullmatch(hi.strip())):
            raise _Refused
        a, b = int(lo), int(hi) if sep else int(lo)
        if len(ports) + abs(b - a) + 1 > MAX_CHANNELS:
            raise _Refused
        ports.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    return ports


def _units(line: str) -> list[tuple[str, _Command, list[str] | None]]:
    """The write units of one line as (unit, command, parameters or None if unreadable), resolved the way
    the switch resolves headers: absolute from the root, relative from the previous header's parent.
    """
    found = []
    path = _ROOT  # path memory lasts for one line (one program message)
    for unit in (u.strip() for u in _split(line, ";")):
        header, _, rest = unit.replace("\t", " ").partition(" ")
        command = None
        if _COMMON_RE.fullmatch(header):
            command = _RST if header.upper() == "*RST" else None  # the other common commands change nothing
        elif _HEADER_RE.fullmatch(header):
            node = parent = _ROOT if header.startswith(":") else path  # parent: set again by every step down
            for mnemonic in header.strip(":?").split(":"):
                child = next((c for c in node.children if c.match(mnemonic)), None)
                if child is None:
                    break
                parent, node = node, child
            else:
                path = parent  # even when the leaf has no such command: the switch moves the path first
                command = None if header.endswith("?") else node.write
        if command:
            rest = rest.strip()
            args = [a.strip() for a in _split(rest, ",")] if rest else []
            found.append((unit, command, None if any(not a for a in args) else args))
    return found


class PolatisAuditModel:
    """What Polatis SCPI commands sent to a switch mean for its circuits."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size  # ingress 1..size, egress size+1..2*size

    def writes(self, line: str) -> list[Write]:
        """The writes in one sent line (compound lines split on ';'); queries and unknown commands give nothing."""
        writes = []
        for unit, command, args in _units(line):
            ports: set[int] = set()
            for arg in (args or [])[: command[3]]:
                try:
                    ports.update(_channels(arg))
                except _Refused:
                    pass  # an unreadable list names no port; the switch refuses the unit anyway
            writes.append(Write(unit, ALL_PORTS if command[0] in _CLEARS_ALL else frozenset(ports)))
        return writes

    def replay(self, circuits: dict[int, int], lines: list[str]) -> dict[int, int]:
        """The circuits (ingress -> egress) after `lines` were sent, starting from `circuits`; a command the
        switch would refuse (bad ports, an egress already in use, more egress than ingress...) changes nothing,
        exactly as the emulator's engine does.
        """
        state = dict(circuits)
        for line in lines:
            for _, command, args in _units(line):
                try:
                    state = self._apply(state, command, args)
                except _Refused:
                    pass
        return state

    def _apply(self, state: dict[int, int], write: _Command, args: list[str] | None) -> dict[int, int]:
        command, fewest, most, _ = write
        if args is None or not fewest <= len(args) <= most:
            raise _Refused
        if command in _CLEARS_ALL:
            return {}
        if command not in ("ADD", "ONLY", "SUB"):
            return state  # PORT:DIS/ENAB and BOOT:MODE leave the circuits alone, accepted or not
        n = self.size
        ingress = self._ports(args[0], 1, n)
        egress = self._ports(args[1], n + 1, 2 * n) if len(args) > 1 else []
        if command == "SUB" and not egress:  # SUB of ingress ports alone: whatever they are connected to
            gone = set(ingress)
            return {i: e for i, e in state.items() if i not in gone}
        if len(egress) != len(ingress) or len(set(ingress)) < len(ingress) or len(set(egress)) < len(egress):
            raise _Refused
        pairs = dict(zip(ingress, egress, strict=True))
        if command == "SUB":  # only the pairs that are connected; the others are ignored, not refused
            return {i: e for i, e in state.items() if pairs.get(i) != e}
        new = {**state, **pairs} if command == "ADD" else pairs  # ADD re-points an ingress already connected
        if len(set(new.values())) < len(new):
            raise _Refused  # an egress would carry two circuits (settings conflict)
        return new

    @staticmethod
    def _ports(text: str, lo: int, hi: int) -> list[int]:
        ports = _channels(text)
        if ports and not lo <= min(ports) <= max(ports) <= hi:
            raise _Refused  # data out of range: the whole unit is refused, not just the stray port
        return ports
