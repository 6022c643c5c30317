"""The TL1 front ends of the emulated switch: Polatis and Calient dialects on the one switch model.

Each front end is a TCP server on 127.0.0.1 (ephemeral port; a lab's Polatis answers TL1 on 3082, a
Calient on 3083 with an `agent>` prompt) whose every command is mapped onto emulators/scpi/ocs.py's public
model API, so SCPI, TL1 and NETCONF clients change the same circuits with the same switching time, dark
moving ports and light. What the dialects accept, answer and deny: docs/protocols.md §8.

Behaviour common to both dialects (the emulator's choices, each an option where it matters):
- every command but ACT-USER needs a login on its connection (DENY PLNA); the user is the spec's, the
  password the twin's (emulators.frontends.twin_password()); a wrong one is DENY PIUI, whichever of the two was wrong;
- a command that moves mirrors is answered COMPLD once the move has settled (`compld_after_settle`):
  COMPLD means "completed", and TL1 has no `*OPC?`; if that is more than `ack_after_s` away, `IP <ctag>`
  and `<` go out at once (the in-progress acknowledgment);
- a command takes effect when it arrives; answers leave in the order the commands came;
- autonomous messages: a port failing or coming back (through the twin's control) is reported to every
  logged-in session as `REPT ALM` (`**` major when it fails, `A` cleared when it is back), between
  responses, never inside one; INH-MSG-ALL / ALW-MSG-ALL turn them off / on per session. The front end
  notices such changes by polling the model every `poll_s` (the model has no change callbacks).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable

from emulators.frontends import twin_password
from emulators.scpi.ocs import PolatisEngine, SwitchRefused
from emulators.spec import OcsSpec
from emulators.tl1 import grammar as g
from emulators.tl1.grammar import Command, Tl1Error
from emulators.tl1.replay import Tl1Replay

Handler = Callable[["Tl1Session", Command, float], list[str]]


class Tl1Session:
    """One client conversation: its login, its input framing, where its output goes.

    `send(at, data)` queues a response not to leave before `at` (in order); `send_now(data)` writes an
    acknowledgment or an autonomous message at once. Tests drive a session without any socket.
    """

    def __init__(self, frontend: Tl1Frontend, send: Callable[[float, bytes], None], send_now: Callable[[bytes], None]):
        self.frontend = frontend
        self.user: str | None = None
        self.inhibited = False  # INH-MSG-ALL: no autonomous messages
        self.framer = g.CommandFramer()
        self.send = send
        self.send_now = send_now

    def receive(self, data: bytes, now: float) -> None:
        for kind, text in self.framer.feed(data):
            if kind == "command":
                self.execute(text, now)
            elif kind == "unterminated":
                try:
                    ctag = g.parse_command(text).ctag
                except Tl1Error:
                    ctag = "0"
                self.send(now, self.frontend.deny(ctag, Tl1Error("IISP", "a command ends with a semicolon")))
            # "overrun": dropped, as the SCPI endpoint drops an over-long line (no CTAG to answer to)

    def execute(self, text: str, now: float) -> None:
        frontend = self.frontend
        try:
            command = g.parse_command(text)
        except Tl1Error as err:
            self.send(now, frontend.deny(err.ctag or "0", err))
            return
        try:
            lines, at = frontend.dispatch(self, command, now)
        except Tl1Error as err:
            self.send(now, frontend.deny(command.ctag, err))
            return
        except Exception as exc:  # a bug: answer (never leave the client waiting) and keep it for the tests
            frontend.internal_errors.append(f"{text!r}: {type(exc).__name__}: {exc}")
            self.send(now, frontend.deny(command.ctag, Tl1Error("SROF", "internal error")))
            return
        if at - now > frontend.ack_after_s:
            self.send_now(g.acknowledgment(command.ctag))
        self.send(at, frontend.reply(command.ctag, lines))


class Tl1Frontend:
    """What both dialects share: the server, sessions, login, alarms. Subclasses add their commands."""

    prompt = b""  # written after every response, and when a client connects
    moves: frozenset[str] = frozenset()  # verbs whose COMPLD waits for the mirrors

    def __init__(
        self,
        engine: PolatisEngine,
        spec: OcsSpec,
        *,
        compld_after_settle: bool = True,
        ack_after_s: float = 2.0,
        poll_s: float = 0.02,
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.sid = spec.name  # the source identifier in every response header
        self.size = engine.size
        self.compld_after_settle = compld_after_settle
        self.ack_after_s = ack_after_s
        self.poll_s = poll_s
        self.sessions: set[Tl1Session] = set()
        self.internal_errors: list[str] = []  # handler exceptions (bugs); the fuzz tests want it empty
        self._handlers: dict[str, Handler] = {
            "ACT-USER": self._act_user,
            "CANC-USER": self._canc_user,
            "RTRV-HDR": lambda s, c, now: [],
            "RTRV-ALM-ALL": self._rtrv_alm,
            "INH-MSG-ALL": lambda s, c, now: self._inhibit(s, True),
            "ALW-MSG-ALL": lambda s, c, now: self._inhibit(s, False),
            **self.commands(),
        }
        self._failed: dict[int, float] = {}  # failed port -> when this front end noticed (wall clock)
        self._generation = engine.rng  # replaced by engine.reset(): how a twin reset is noticed
        self._atag = 0
        self._server: asyncio.AbstractServer | None = None
        self._protocols: set[_Tl1Protocol] = set()
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def replay(cls, engine: PolatisEngine, spec: OcsSpec) -> Tl1Replay:
        """A session replaying a run's audit log (`testbed replay`) on a front end of this dialect, no server."""
        return Tl1Replay(cls(engine, spec))

    # -- what subclasses provide --------------------------------------------------------------------

    def commands(self) -> dict[str, Handler]:
        return {}

    def alarm_aid(self, port: int) -> str:
        return str(port)

    def forget(self) -> None:
        """The model was reset through the twin's control: drop what this front end keeps of its own."""

    # -- the server -----------------------------------------------------------------------------------

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        self._server = await loop.create_server(lambda: _Tl1Protocol(self), "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self._timer = loop.call_later(self.poll_s, self._tick, loop)
        return {"tl1": f"127.0.0.1:{port}"}

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for protocol in list(self._protocols):
            protocol.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def new_session(self, send: Callable[[float, bytes], None], send_now: Callable[[bytes], None]) -> Tl1Session:
        session = Tl1Session(self, send, send_now)
        self.sessions.add(session)
        return session

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.poll()
        finally:
            self._timer = loop.call_later(self.poll_s, self._tick, loop)

    # -- commands -------------------------------------------------------------------------------------

    def dispatch(self, session: Tl1Session, command: Command, now: float) -> tuple[list[str], float]:
        """The response lines and when they may leave; raises Tl1Error for a DENY."""
        self._notice_reset()  # before the command: a reset since the last one wiped what it refers to
        if command.tid and g.unquote(command.tid).upper() != self.sid.upper():
            raise Tl1Error("IITA", f"this switch is {self.sid}; leave the TID empty or name it")
        handler = self._handlers.get(command.verb)
        if handler is None:
            raise Tl1Error("ICNV", f"unknown command {g.clip(command.verb)}")
        if session.user is None and command.verb != "ACT-USER":
            raise Tl1Error("PLNA", "log in first with ACT-USER")
        lines = handler(session, command, now)
        if command.verb in self.moves and self.compld_after_settle:
            return lines, self.engine.operations_complete_at(now)
        return lines, now

    def reply(self, ctag: str, lines: list[str]) -> bytes:
        return g.response(self.sid, ctag, lines) + self.prompt

    def deny(self, ctag: str, err: Tl1Error) -> bytes:
        return g.deny(self.sid, ctag, err.code, err.text) + self.prompt

    def _act_user(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        user, password = g.unquote(command.aid), g.unquote(command.payload(0))
        if user != self.spec.user or password != twin_password():
            raise Tl1Error("PIUI", "login refused: unknown user or wrong password")
        already = session.user is not None
        session.user = user
        return ["/* Already logged in */"] if already else []

    def _canc_user(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        session.user = None
        return []

    def _inhibit(self, session: Tl1Session, inhibited: bool) -> list[str]:
        session.inhibited = inhibited
        return []

    # -- alarms ---------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Report ports that failed or came back since the last look; notice a reset of the model."""
        self._notice_reset()
        failed = set(self.engine.failed)
        if failed == self._failed.keys():
            return
        wall = time.time()
        for port in sorted(failed - self._failed.keys()):
            self._failed[port] = wall
            self._broadcast("**", [self._alarm_line(port, "MJ", wall)], wall)
        for port in sorted(self._failed.keys() - failed):
            del self._failed[port]
            self._broadcast("A", [self._alarm_line(port, "CL", wall)], wall)

    def _notice_reset(self) -> None:
        if self.engine.rng is not self._generation:  # engine.reset() makes a new one
            self._generation = self.engine.rng
            self.forget()

    def _alarm_line(self, port: int, ntfcncde: str, wall: float) -> str:
        # GR-833 style: "<aid>:<ntfcncde>,<condtype>,<srveff>,<ocrdat>,<ocrtm>,<locn>,<dirn>:<condescr>";
        # RCV for a port light enters the switch by (ingress), TRMT for one it leaves by (egress).
        dirn = "RCV" if port <= self.size else "TRMT"
        when = time.strftime("%m-%d,%H-%M-%S", time.localtime(wall))
        text = "port failed" if ntfcncde != "CL" else "port restored"
        return g.quoted(f'{self.alarm_aid(port)}:{ntfcncde},FAIL,SA,{when},,{dirn}:"{text}"')

    def _broadcast(self, almcde: str, lines: list[str], wall: float) -> None:
        self._atag += 1
        data = g.autonomous(self.sid, almcde, self._atag, "REPT ALM", lines, wall=wall)
        for session in list(self.sessions):
            if session.user is not None and not session.inhibited:
                session.send_now(data)

    def _rtrv_alm(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        self.poll()
        return [self._alarm_line(port, "MJ", wall) for port, wall in sorted(self._failed.items())]


class PolatisTl1Frontend(Tl1Frontend):
    """Polatis TL1: ports 1..2N by number (ingress 1..N, egress N+1..2N), lists `1&2`, ranges `1&&4`."""

    moves = frozenset({"ENT-PATCH", "DLT-PATCH"})

    def commands(self) -> dict[str, Handler]:
        return {
            "ENT-PATCH": self._ent_patch,
            "DLT-PATCH": self._dlt_patch,
            "RTRV-PATCH": self._rtrv_patch,
            "OPR-PORT-SHUTTER": lambda s, c, now: self._shutter(c, False),
            "RLS-PORT-SHUTTER": lambda s, c, now: self._shutter(c, True),
            "RTRV-PORT-SHUTTER": self._rtrv_shutter,
            "RTRV-PORT-POWER": self._rtrv_power,
            "RTRV-PORT-PMON": self._rtrv_pmon,
            "RTRV-EQPT": self._rtrv_eqpt,
            "RTRV-NETYPE": self._rtrv_netype,
            "RTRV-INV": self._rtrv_inv,
        }

    def _ports(self, aid: str, *, empty_is_all: bool) -> list[int]:
        if not aid.strip() and empty_is_all:
            return list(range(1, 2 * self.size + 1))
        return g.number_list(aid, 1, 2 * self.size)

    def _ent_patch(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        n = self.size
        sides = g.split_outside_quotes(command.aid, ",")
        if len(sides) != 2:
            raise Tl1Error("IIAC", "expected <ports>,<ports> such as 1,17 or 1&2,17&18")
        first, second = (g.number_list(side, 1, 2 * n) for side in sides)
        if len(first) != len(second):
            raise Tl1Error("IIAC", "as many ports after the comma as before it")
        pairs = []
        for a, b in zip(first, second, strict=True):
            i, e = min(a, b), max(a, b)  # either order: a circuit is one ingress and one egress
            if not i <= n < e:
                raise Tl1Error("IIAC", f"{a},{b}: a patch joins an ingress 1..{n} and an egress {n + 1}..{2 * n}")
            pairs.append((i, e))
        if len({i for i, _ in pairs}) < len(pairs) or len({e for _, e in pairs}) < len(pairs):
            raise Tl1Error("IDNV", "a port is listed twice")
        merged = {**self.engine.circuits(), **dict(pairs)}  # a connected ingress is re-pointed
        owners: dict[int, int] = {}
        for i, e in merged.items():
            if owners.setdefault(e, i) != i:
                raise Tl1Error("SNVS", f"egress {e} is patched to ingress {owners[e]}")
        try:
            self.engine.connect_pairs(pairs, now)
        except SwitchRefused as exc:  # checked above; the model has the last word
            raise Tl1Error("SNVS", str(exc)) from None
        return []

    def _dlt_patch(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        if command.aid.strip().upper() == "ALL":
            self.engine.replace_circuits([], now)
        else:
            self.engine.disconnect_ports(self._ports(command.aid, empty_is_all=False), now)
        return []

    def _rtrv_patch(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        wanted = set(self._ports(command.aid, empty_is_all=True))
        return [g.quoted(f"{i},{e}") for i, e in sorted(self.engine.circuits().items()) if i in wanted or e in wanted]

    def _shutter(self, command: Command, enabled: bool) -> list[str]:
        self.engine.set_ports_enabled(self._ports(command.aid, empty_is_all=False), enabled, f"tl1 {command.verb}")
        return []

    def _rtrv_shutter(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        enabled = self.engine.enabled
        return [
            g.quoted(f"{p}:{'OPEN' if enabled[p] else 'CLOSED'}") for p in self._ports(command.aid, empty_is_all=True)
        ]

    def _rtrv_power(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        power = self.engine.power_dbm
        return [g.quoted(f"{p}:{power(p, now):.2f}") for p in self._ports(command.aid, empty_is_all=True)]

    def _rtrv_pmon(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        # wavelength (nm), calibration offset (dB), averaging time (s): fixed, the model has no such settings
        return [g.quoted(f"{p}:1550.0,0.00,1") for p in self._ports(command.aid, empty_is_all=True)]

    def _rtrv_eqpt(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        if g.unquote(command.aid).upper() != "SYSTEM":
            raise Tl1Error("IIAC", "the equipment this switch describes is SYSTEM")
        wanted = g.keywords(list(command.blocks[1:])).get("PARAMETER", "SIZE").upper()
        if wanted != "SIZE":
            raise Tl1Error("IDNV", "PARAMETER=SIZE is the only one emulated")
        return [g.quoted(f"SYSTEM:SIZE={self.size}x{self.size}")]

    def _identity(self) -> list[str]:
        fields = [f.strip() for f in self.spec.idn.split(",")] + ["", "", "", ""]
        return fields[:4]

    def _rtrv_netype(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        vendor, model, _serial, firmware = self._identity()
        return [g.quoted(f"{vendor},{model},OCS,{firmware}")]

    def _rtrv_inv(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        if command.aid and g.unquote(command.aid).upper() != "OCS":
            raise Tl1Error("IIAC", "the inventory this switch describes is OCS")
        _vendor, model, serial, _firmware = self._identity()
        return [g.quoted(f"OCS:PN={model},SN={serial}")]


PORTS_PER_SLOT = 8  # Calient port names <shelf>.<slot>.<port>; the counts per slot and shelf are the project's
SLOTS_PER_SHELF = 8
_GROUP = re.compile(r"[A-Za-z0-9_.-]{0,32}")
_DOTTED = re.compile(r"(\d{1,4})\.(\d{1,4})\.(\d{1,4})")


class CalientTl1Frontend(Tl1Frontend):
    """Calient TL1: N bidirectional ports named <shelf>.<slot>.<port>; port k's input side is the model's
    ingress k, its output side the model's egress N+k. A cross-connect is entered (ENT-CRS) and then
    activated (ACT-CRS: the mirrors move); CANC-CRS deactivates it and DLT-CRS deletes an inactive one.
    """

    prompt = b"\r\nagent>"
    moves = frozenset({"ACT-CRS", "CANC-CRS"})

    def __init__(self, engine: PolatisEngine, spec: OcsSpec, **options) -> None:
        # Cross-connects entered but not active, and the group and name of the active ones entered here:
        # (source port, destination port) -> (group, name). The active set itself is the model's circuits.
        self.pending: dict[tuple[int, int], tuple[str, str]] = {}
        self.labels: dict[tuple[int, int], tuple[str, str]] = {}
        super().__init__(engine, spec, **options)

    def commands(self) -> dict[str, Handler]:
        return {
            "RTRV-NE": self._rtrv_ne,
            "RTRV-PORT": self._rtrv_port,
            "RTRV-PORT-SUM": self._rtrv_port_sum,
            "RTRV-CRS": self._rtrv_crs,
            "ENT-CRS": self._ent_crs,
            "ACT-CRS": self._act_crs,
            "CANC-CRS": self._canc_crs,
            "DLT-CRS": self._dlt_crs,
            "ED-PORT": self._ed_port,
        }

    def forget(self) -> None:
        self.pending.clear()
        self.labels.clear()

    # -- port names -----------------------------------------------------------------------------------

    @staticmethod
    def aid(k: int) -> str:
        shelf, rest = divmod(k - 1, PORTS_PER_SLOT * SLOTS_PER_SHELF)
        slot, port = divmod(rest, PORTS_PER_SLOT)
        return f"{shelf + 1}.{slot + 1}.{port + 1}"

    def port(self, aid: str) -> int:
        m = _DOTTED.fullmatch(aid.strip())
        if m:
            shelf, slot, port = (int(x) for x in m.groups())
            if shelf >= 1 and 1 <= slot <= SLOTS_PER_SHELF and 1 <= port <= PORTS_PER_SLOT:
                k = ((shelf - 1) * SLOTS_PER_SHELF + slot - 1) * PORTS_PER_SLOT + port
                if k <= self.size:
                    return k
        raise Tl1Error("IIAC", f"no port {g.clip(aid)} (ports 1.1.1 to {self.aid(self.size)})")

    def alarm_aid(self, port: int) -> str:
        return self.aid(port if port <= self.size else port - self.size)

    def _ports(self, aid: str, *, empty_is_all: bool) -> list[int]:
        text = aid.strip()
        if empty_is_all and text.upper() in ("", "0", "ALL"):  # Quali lists every port with RTRV-PORT::0;
            return list(range(1, self.size + 1))
        return [self.port(item) for item in text.split("&")]

    def _pair(self, command: Command) -> tuple[int, int]:
        ends = g.split_outside_quotes(command.aid, ",")
        if len(ends) != 2:
            raise Tl1Error("IIAC", "expected <source port>,<destination port> such as 1.1.1,1.1.2")
        return self.port(ends[0]), self.port(ends[1])

    def _name(self, s: int, d: int) -> tuple[str, str]:
        return self.pending.get((s, d)) or self.labels.get((s, d)) or ("NONE", f"{self.aid(s)}>{self.aid(d)}")

    # -- cross-connects -------------------------------------------------------------------------------

    def _ent_crs(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        s, d = self._pair(command)
        fields = g.split_outside_quotes(command.payload(0), ",")
        group = g.unquote(fields[0])
        kind = fields[1].strip().upper() if len(fields) > 1 and fields[1].strip() else "1WAY"
        if not _GROUP.fullmatch(group):
            raise Tl1Error("IDNV", "a group name is up to 32 letters, digits, '_', '.' or '-'")
        if kind == "2WAY":
            raise Tl1Error("INUP", "2WAY cross-connects are not emulated: enter two 1WAY ones")
        if kind != "1WAY":
            raise Tl1Error("IDNV", "the connection type is 1WAY")
        circuits, n = self.engine.circuits(), self.size
        if (s, d) in self.pending or circuits.get(s) == n + d:
            raise Tl1Error("SNVS", f"{self.aid(s)}>{self.aid(d)} exists already")
        if s in circuits or any(ps == s for ps, _ in self.pending):
            raise Tl1Error("SNVS", f"the input of {self.aid(s)} is in another cross-connect")
        if n + d in circuits.values() or any(pd == d for _, pd in self.pending):
            raise Tl1Error("SNVS", f"the output of {self.aid(d)} is in another cross-connect")
        self.pending[(s, d)] = (group or "NONE", f"{self.aid(s)}>{self.aid(d)}")
        return []

    def _act_crs(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        s, d = self._pair(command)
        circuits, n = self.engine.circuits(), self.size
        if circuits.get(s) == n + d:
            raise Tl1Error("SNVS", f"{self.aid(s)}>{self.aid(d)} is active already")
        if (s, d) not in self.pending:
            raise Tl1Error("IIAC", f"no cross-connect {self.aid(s)}>{self.aid(d)}: ENT-CRS first")
        if s in circuits or n + d in circuits.values():
            raise Tl1Error("SNVS", "a port of this cross-connect carries another circuit")
        try:
            self.engine.connect_pairs([(s, n + d)], now)
        except SwitchRefused as exc:
            raise Tl1Error("SNVS", str(exc)) from None
        self.labels[(s, d)] = self.pending.pop((s, d))
        return []

    def _canc_crs(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        s, d = self._pair(command)
        if self.engine.circuits().get(s) == self.size + d:
            label = self._name(s, d)
            self.engine.disconnect_ports([s], now)
            self.labels.pop((s, d), None)
            self.pending[(s, d)] = label
            return []
        if (s, d) in self.pending:
            raise Tl1Error("SNVS", f"{self.aid(s)}>{self.aid(d)} is not active")
        raise Tl1Error("IIAC", f"no cross-connect {self.aid(s)}>{self.aid(d)}")

    def _dlt_crs(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        s, d = self._pair(command)
        if (s, d) in self.pending:
            del self.pending[(s, d)]
            return []
        if self.engine.circuits().get(s) == self.size + d:
            raise Tl1Error("SNVS", f"{self.aid(s)}>{self.aid(d)} is active: CANC-CRS it first")
        raise Tl1Error("IIAC", f"no cross-connect {self.aid(s)}>{self.aid(d)}")

    def _connections(self) -> list[tuple[int, int, bool]]:
        """(source, destination, active) of every cross-connect, active ones from the model."""
        n = self.size
        found = {(i, e - n): True for i, e in self.engine.circuits().items()}
        for pair in self.pending:
            found.setdefault(pair, False)
        return [(s, d, active) for (s, d), active in sorted(found.items())]

    def _rtrv_crs(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        wanted = set(self._ports(command.aid, empty_is_all=True))
        lines = []
        for s, d, active in self._connections():
            if s not in wanted and d not in wanted:
                continue
            group, name = self._name(s, d)
            failed = self.engine.port_state(s) == "F" or self.engine.port_state(self.size + d) == "F"
            lines.append(
                g.quoted(
                    f"{name}:SRCPORT={self.aid(s)},DSTPORT={self.aid(d)},GRPNAME={group},CONNNAME={name},"
                    f"CONNTYPE=1WAY,AS=UMA,OS={'RDY' if active else 'PND'},OC={'FAIL' if failed else 'OK'},"
                    f"PS=UPR,AL={'MJ' if failed else 'CL'}"
                )
            )
        return lines

    # -- ports ----------------------------------------------------------------------------------------

    def _side(self, port: int) -> tuple[str, str, str]:
        """(AS, OS, OC) of one side: administrative state, operational state, operational condition."""
        state = self.engine.port_state(port)
        admin = "IS" if self.engine.enabled[port] else "OOS"
        return admin, "IS" if state == "E" else "OOS", "FAIL" if state == "F" else "OK"

    def _rtrv_port(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        lines = []
        for k in self._ports(command.aid, empty_is_all=True):
            ias, ios, ioc = self._side(k)
            oas, oos, ooc = self._side(self.size + k)
            lines.append(
                g.quoted(
                    f"{self.aid(k)}:WX,NONE,NONE:INAS={ias},INOS={ios},INOC={ioc},INRS=NPR,"
                    f"OUTAS={oas},OUTOS={oos},OUTOC={ooc},OUTRS=NPR"
                )
            )
        return lines

    def _rtrv_port_sum(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        n, power = self.size, self.engine.power_dbm
        connections = self._connections()
        lines = []
        for k in self._ports(command.aid, empty_is_all=True):
            # CONNNAME1: the cross-connect this port's input feeds; CONNNAME2: the one its output is fed by
            summary = []
            for slot, mine in ((1, [c for c in connections if c[0] == k]), (2, [c for c in connections if c[1] == k])):
                name = self._name(*mine[0][:2])[1] if mine else "NONE"
                state = "ACT" if mine and mine[0][2] else "NONE"
                summary.append(f"CONNNAME{slot}={name},CONNSTATE{slot}={state}")
            lines.append(
                g.quoted(
                    f"{self.aid(k)}:ALIAS=NONE,INPWR={power(k, now):.2f},OUTPWR={power(n + k, now):.2f},"
                    + ",".join(summary)
                )
            )
        return lines

    def _ed_port(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        ports = self._ports(command.aid, empty_is_all=False)
        settings = g.keywords(list(command.blocks[1:]))
        if not settings:
            raise Tl1Error("IPMS", "expected INAS=IS|OOS and/or OUTAS=IS|OOS")
        for key, value in settings.items():
            if key not in ("INAS", "OUTAS"):
                raise Tl1Error("IPNV", f"{g.clip(key)}: only INAS and OUTAS can be edited")
            if value.upper() not in ("IS", "OOS"):
                raise Tl1Error("IDNV", f"{key}={g.clip(value)}: IS (in service) or OOS (out of service)")
        for key, value in settings.items():
            offset = 0 if key == "INAS" else self.size
            self.engine.set_ports_enabled([offset + k for k in ports], value.upper() == "IS", "tl1 ED-PORT")
        return []

    def _rtrv_ne(self, session: Tl1Session, command: Command, now: float) -> list[str]:
        fields = [f.strip() for f in self.spec.idn.split(",")] + ["", "", "", ""]
        vendor, model, serial, firmware = fields[:4]
        model = model if vendor.upper().startswith("CALIENT") and model else "S320"
        return [
            g.quoted(
                f"{self.sid}:SERIALNUMBER={serial or '0'},SWPACKAGE={firmware or '0'},STATUS=OK,"
                f"CHASSISTYPE={model},PLATFORM=VERSION2"
            )
        ]


class _Tl1Protocol(asyncio.Protocol):
    """One TCP connection: a session, and the queue that keeps its responses in order and on time."""

    def __init__(self, frontend: Tl1Frontend) -> None:
        self.frontend = frontend
        self.transport: asyncio.Transport | None = None
        self.session: Tl1Session | None = None
        self._queue: deque[tuple[float, bytes]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self.session = self.frontend.new_session(self._send, self._write)
        self.frontend._protocols.add(self)
        if self.frontend.prompt:
            self._write(self.frontend.prompt.lstrip(b"\r\n"))

    def data_received(self, data: bytes) -> None:
        assert self.session is not None and self._loop is not None
        self.session.receive(data, self._loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        self.frontend.sessions.discard(self.session)
        self.frontend._protocols.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _send(self, at: float, data: bytes) -> None:
        assert self._loop is not None
        if not self._queue and at <= self._loop.time():
            self._write(data)
            return
        if self._queue:
            at = max(at, self._queue[-1][0])  # never overtake an earlier response
        self._queue.append((at, data))
        if self._timer is None:
            self._timer = self._loop.call_at(self._queue[0][0], self._pump)

    def _pump(self) -> None:
        assert self._loop is not None
        self._timer = None
        now = self._loop.time()
        while self._queue and self._queue[0][0] <= now:
            self._write(self._queue.popleft()[1])
        if self._queue:
            self._timer = self._loop.call_at(self._queue[0][0], self._pump)
