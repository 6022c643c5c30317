"""The TL1 drivers' own account of their commands: what the commands sent to a switch do to its circuits.

`testbed check` replays a run's audit log (each TL1 command the transport sent is one tx record) through
these models, never through the emulator (see drivers/scpi/audit.py for why); tests/tl1/test_tl1_audit.py
holds them to the emulated switches by differential fuzzing.

Modelled is what decides the circuits: cutting the text into commands at `;` outside quoted strings (a
line break ends an unfinished command, which the switch then denies), the syntax every command must pass
(printable ASCII, balanced quotes, the verb, a CTAG of 1-6 letters or digits, or none), and for each
changing command the rules under which the switch accepts it; a denied command changes nothing.

Assumed, since the log cannot say otherwise: every command was sent in a logged-in session (the transport
logs in before anything else, and ACT-USER's password is masked in the log), and a TID, if any, names the
switch (the drivers send none), unless the model is given the switch's name (`sid`). Calient: a
cross-connect entered but not activated within one replay is forgotten at its end (the driver never leaves
one: it deletes an entry whose activation is refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from drivers.audit import ALL_PORTS
from drivers.scpi.audit import Write
from drivers.tl1.calient import port_of

__all__ = ["CalientTl1AuditModel", "PolatisTl1AuditModel", "Write"]

MAX_COMMAND = 64 * 1024  # the switch drops a longer command (its input limit)
MAX_LIST = 65536
_CTAG = re.compile(r"[A-Za-z0-9]{1,6}")
_VERB = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+){0,2}")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_NUMBER_LIST = re.compile(r"\d{1,9}(?:&&\d{1,9})?(?:&\d{1,9}(?:&&\d{1,9})?)*")
_LIST_ITEM = re.compile(r"(\d+)(?:&&(\d+))?")
_GROUP = re.compile(r"[A-Za-z0-9_.-]{0,32}")


class _Denied(Exception):
    """The switch would deny the command: it changes nothing."""


@dataclass(frozen=True)
class _Command:
    text: str
    verb: str
    tid: str
    aid: str
    blocks: tuple[str, ...]  # after the CTAG: general block, payload blocks

    def payload(self, index: int) -> str:
        i = index + 1
        return self.blocks[i].strip() if i < len(self.blocks) else ""


def split_commands(text: str) -> list[str]:
    """The commands in sent text: cut at `;` outside double quotes; text a line break ends without a `;`
    is left out (the switch denies it), as is a command longer than the switch takes.
    """
    commands: list[str] = []
    buf: list[str] = []
    quoted = escaped = discarding = False
    for c in text:
        if escaped:
            escaped = False
            if c not in "\r\n":
                buf.append(c)
                continue
        if quoted and c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c in "\r\n" or (c == ";" and not quoted):
            if c == ";" and not discarding:
                commands.append("".join(buf))
            buf, quoted, discarding = [], False, False
            continue
        if not discarding:
            buf.append(c)
            if len(buf) > MAX_COMMAND:
                buf, quoted, discarding = [], False, True
    return commands


def _split(text: str, sep: str) -> list[str]:
    parts, start, quoted, i = [], 0, False, 0
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
        raise _Denied
    parts.append(text[start:])
    return parts


def _parse(text: str) -> _Command:
    """One command as the switch reads it; raises _Denied for one it refuses on syntax alone."""
    text = text.strip(" \t\r\n")
    if not _PRINTABLE.fullmatch(text):
        raise _Denied
    blocks = _split(text, ":")
    verb, tid, aid, ctag = ([b.strip() for b in blocks[:4]] + ["", "", "", ""])[:4]
    if (ctag and not _CTAG.fullmatch(ctag)) or not _VERB.fullmatch(verb):
        raise _Denied
    return _Command(text, verb.upper(), _unquote(tid), aid, tuple(blocks[4:]))


def _numbers(text: str, lo: int | None = None, hi: int | None = None) -> list[int]:
    """`1&2`, `1&&4` (either way round); with lo/hi, a number outside them denies the command."""
    text = text.strip()
    if not _NUMBER_LIST.fullmatch(text):
        raise _Denied
    ports: list[int] = []
    for m in _LIST_ITEM.finditer(text):
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        if len(ports) + abs(b - a) + 1 > MAX_LIST:
            raise _Denied
        ports.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
    if lo is not None and hi is not None and any(not lo <= p <= hi for p in ports):  # given together
        raise _Denied
    return ports


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _keywords(blocks: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for block in blocks:
        for item in _split(block, ","):
            key, eq, value = item.strip().partition("=")
            if item.strip() and (not eq or not key.strip()):
                raise _Denied
            if eq:
                found[key.strip().upper()] = _unquote(value)
    return found


class _Model:
    """What both dialects share: reading commands, the replay loop."""

    writes_verbs: frozenset[str] = frozenset()

    def __init__(self, size: int, sid: str | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.sid = sid  # the switch's name (TL1 SID): a command with another TID is denied; None: unknown

    def writes(self, line: str) -> list[Write]:
        """The writes in sent text, accepted or not (the audit is of intent), with the ports they name."""
        found = []
        for text in split_commands(line):
            try:
                command = _parse(text)
            except _Denied:
                continue
            if command.verb in self.writes_verbs:
                found.append(Write(command.text, self._ports_named(command)))
        return found

    def replay(self, circuits: dict[int, int], lines: list[str]) -> dict[int, int]:
        """The circuits (ingress -> egress) after `lines` were sent, starting from `circuits`."""
        state = _State(dict(circuits))
        for line in lines:
            for text in split_commands(line):
                try:
                    command = _parse(text)
                    if self.sid is not None and command.tid and command.tid.upper() != self.sid.upper():
                        raise _Denied
                    self._apply(state, command)
                except _Denied:
                    pass
        return state.circuits

    def _apply(self, state: _State, command: _Command) -> None:
        raise NotImplementedError

    def _ports_named(self, command: _Command):
        raise NotImplementedError


@dataclass
class _State:
    circuits: dict[int, int]
    pending: dict[tuple[int, int], None] | None = None  # Calient: entered, not active (ordered set)


class PolatisTl1AuditModel(_Model):
    """Polatis TL1: ENT-PATCH and DLT-PATCH change circuits; OPR/RLS-PORT-SHUTTER are writes that do not."""

    writes_verbs = frozenset({"ENT-PATCH", "DLT-PATCH", "OPR-PORT-SHUTTER", "RLS-PORT-SHUTTER"})

    def _ports_named(self, command: _Command):
        if command.verb == "DLT-PATCH" and command.aid.strip().upper() == "ALL":
            return ALL_PORTS
        ports: set[int] = set()
        for side in command.aid.split(","):
            try:
                ports.update(_numbers(side))
            except _Denied:
                pass  # an unreadable list names no port; the switch denies the command anyway
        return frozenset(ports)

    def _apply(self, state: _State, command: _Command) -> None:
        n = self.size
        if command.verb == "ENT-PATCH":
            sides = _split(command.aid, ",")
            if len(sides) != 2:
                raise _Denied
            first, second = _numbers(sides[0], 1, 2 * n), _numbers(sides[1], 1, 2 * n)
            if len(first) != len(second):
                raise _Denied
            pairs = [(min(a, b), max(a, b)) for a, b in zip(first, second, strict=True)]
            if any(not i <= n < e for i, e in pairs):
                raise _Denied  # both ports on one side
            if len({i for i, _ in pairs}) < len(pairs) or len({e for _, e in pairs}) < len(pairs):
                raise _Denied
            merged = {**state.circuits, **dict(pairs)}  # a patched ingress is re-pointed
            if len(set(merged.values())) < len(merged):
                raise _Denied  # an egress would be patched to two ingress ports
            state.circuits = merged
        elif command.verb == "DLT-PATCH":
            if command.aid.strip().upper() == "ALL":
                state.circuits = {}
                return
            gone = set(_numbers(command.aid, 1, 2 * n))
            state.circuits = {i: e for i, e in state.circuits.items() if i not in gone and e not in gone}


class CalientTl1AuditModel(_Model):
    """Calient TL1: ENT-CRS enters a cross-connect, ACT-CRS makes it a circuit, CANC-CRS takes the circuit
    away (the entry stays), DLT-CRS deletes an inactive entry. ED-PORT is a write that changes no circuit.
    Port k (drivers/tl1/calient.py's numbering) is ingress k on its input side, egress N+k on its output.
    """

    writes_verbs = frozenset({"ENT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS", "ED-PORT"})

    def _port(self, aid: str) -> int:
        k = port_of(aid)
        if k is None or k > self.size:
            raise _Denied
        return k

    def _pair(self, command: _Command) -> tuple[int, int]:
        ends = _split(command.aid, ",")
        if len(ends) != 2:
            raise _Denied
        return self._port(ends[0]), self._port(ends[1])

    def _ports_named(self, command: _Command):
        n = self.size
        try:
            if command.verb != "ED-PORT":
                s, d = self._pair(command)
                return frozenset({s, n + d})
            ports = [self._port(a) for a in command.aid.strip().split("&")]
            sides = _keywords(command.blocks[1:])
        except _Denied:
            return frozenset()
        named = set()
        if "INAS" in sides:
            named.update(ports)
        if "OUTAS" in sides:
            named.update(n + k for k in ports)
        return frozenset(named)

    def _apply(self, state: _State, command: _Command) -> None:
        if command.verb not in ("ENT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS"):
            return
        n = self.size
        if state.pending is None:
            state.pending = {}
        pending, circuits = state.pending, state.circuits
        s, d = self._pair(command)
        active = circuits.get(s) == n + d
        if command.verb == "ENT-CRS":
            fields = _split(command.payload(0), ",")
            kind = fields[1].strip().upper() if len(fields) > 1 and fields[1].strip() else "1WAY"
            if not _GROUP.fullmatch(_unquote(fields[0])) or kind != "1WAY":
                raise _Denied
            if (s, d) in pending or active:
                raise _Denied  # exists already
            if s in circuits or any(ps == s for ps, _ in pending):
                raise _Denied  # the source's input is taken
            if n + d in circuits.values() or any(pd == d for _, pd in pending):
                raise _Denied  # the destination's output is taken
            pending[(s, d)] = None
        elif command.verb == "ACT-CRS":
            if active or (s, d) not in pending or s in circuits or n + d in circuits.values():
                raise _Denied
            del pending[(s, d)]
            state.circuits = {**circuits, s: n + d}
        elif command.verb == "CANC-CRS":
            if not active:
                raise _Denied
            state.circuits = {i: e for i, e in circuits.items() if i != s}
            pending[(s, d)] = None
        elif command.verb == "DLT-CRS":
            if (s, d) not in pending:
                raise _Denied  # unknown, or active (CANC-CRS first)
            del pending[(s, d)]
