"""A Polatis-style optical circuit switch speaking SCPI (docs/protocols.md §1).

Ports: ingress 1..N, egress N+1..2N, connections ingress->egress one-to-one. Every connection change
moves the affected ports for switching_time_ms ± jitter_ms (one seeded draw per command: the switch
steers all beams of one command in parallel); a moving port is dark, and `*OPC?` answers when the last
move has settled.

Choices where the reference is unsure (engine options, defaults in brackets):
- `:OXC:SWIT:CONN:PORT?` answers the bare peer number, or an empty line if unconnected
  [quote_port_reply=False]; True gives `"17"` / `""` as the C# driver in the reference suggests.
- Compound queries answer one line each [join_compound=False].
- Ranges in channel lists `(@1:4)` [allow_ranges=True].
- `SUB` of a pair that is not connected is ignored (idempotent removal, no error).
- Commands after `*WAI` take effect immediately in the state model but start their move when the
  earlier moves have settled; their answers are not sent before that.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from emulators.scpi.engine import (
    Call,
    ScpiEngine,
    ScpiError,
    parse_channel_list,
    parse_choice,
    parse_int,
)
from emulators.spec import OcsSpec

DARK_DBM = -99.99


class SwitchRefused(ValueError):
    """The switch refuses a change (a port out of range, listed twice, an egress in use): nothing changed."""


_BOOT_MODE_SHORT = {"DARK": "DARK", "RESTORE": "REST", "AUTOSAVE": "AUT"}  # queries answer short forms


class PolatisEngine(ScpiEngine):
    # Methods the twin's control server may call (emulators/twin.py); each returns JSON-able data.
    control_ops = ("fail_port", "restore_port", "set_input_power", "set_switching_time", "reset", "state")

    def __init__(
        self,
        spec: OcsSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        quote_port_reply: bool = False,
        join_compound: bool = False,
        allow_ranges: bool = True,
        query_interrupt: bool = False,
    ):
        if spec.size < 1:
            raise ValueError(f"OCS {spec.name!r}: size must be >= 1, got {spec.size}")
        super().__init__(spec.idn, join_compound=join_compound, query_interrupt=query_interrupt)
        self.spec = spec
        self.size = spec.size
        self.clock = clock  # only for the control API; the SCPI path gets `now` from its caller
        self.quote_port_reply = quote_port_reply
        self.allow_ranges = allow_ranges
        # Light arriving on an ingress port over a trunk from another switch, read live (set by the twin,
        # emulators/dataplane/paths.py couple_trunk_light): port -> f(now) -> dBm, or None when dark.
        self.input_feeds: dict[int, Callable[[float], float | None]] = {}
        # The twin's ground truth (emulators/truth.py), when it keeps one: ports taken out of service and back.
        self.truth: Any = None
        self._register_commands()
        self.reset()

    # ---- control API (tests, fault injection) -------------------------------------------------

    def reset(self) -> None:
        """Back to the state described by the spec: its circuits (none unless given), ports enabled, fresh RNG."""
        self.conn: dict[int, int] = {int(i): int(e) for i, e in self.spec.circuits}
        self.conn_to: dict[int, int] = {e: i for i, e in self.conn.items()}  # a power read per egress: no scan
        self.enabled = {p: True for p in self._all_ports()}
        self.failed: set[int] = set()
        self.input_power = {int(p): float(v) for p, v in self.spec.input_power_dbm.items()}
        self.moving_until: dict[int, float] = {}
        self._latest_move = float("-inf")  # the latest time in moving_until
        self.switching_time_ms = self.spec.switching_time_ms
        self.jitter_ms = self.spec.jitter_ms
        self.boot_mode = "DARK"
        self.rng = random.Random(self.spec.seed)
        self.reset_status()

    def fail_port(self, port: int) -> None:
        self.failed.add(self._check_port(port))

    def restore_port(self, port: int) -> None:
        self.failed.discard(self._check_port(port))

    def set_input_power(self, port: int, dbm: float | None) -> None:
        """Light arriving on an ingress port; None removes it (the transmitter is off)."""
        if not 1 <= port <= self.size:
            raise ValueError(f"port {port} is not an ingress port (1..{self.size})")
        if dbm is None:
            self.input_power.pop(port, None)
        else:
            self.input_power[port] = float(dbm)

    def set_switching_time(self, ms: float, jitter_ms: float | None = None) -> None:
        """Applies to moves started from now on."""
        if ms < 0 or (jitter_ms is not None and jitter_ms < 0):
            raise ValueError("switching time and jitter must be >= 0")
        self.switching_time_ms = float(ms)
        if jitter_ms is not None:
            self.jitter_ms = float(jitter_ms)

    def state(self, now: float | None = None) -> dict[str, Any]:
        now = self.clock() if now is None else now
        return {
            "name": self.spec.name,
            "size": self.size,
            "now": now,
            "connections": sorted([i, e] for i, e in self.conn.items()),
            "port_states": {str(p): self.port_state(p) for p in self._all_ports()},
            "moving": sorted(p for p, t in self.moving_until.items() if t > now),
            "settled_at": max(self.moving_until.values(), default=None),
            "input_power_dbm": {str(p): v for p, v in sorted(self.input_power.items())},
            "switching_time_ms": self.switching_time_ms,
            "jitter_ms": self.jitter_ms,
            "boot_mode": self.boot_mode,
            "errors": [text for _, text in self.errors],
        }

    # ---- the optical model (also used by the coupled twin) ------------------------------------

    def port_state(self, port: int) -> str:
        if port in self.failed:
            return "F"
        return "E" if self.enabled[port] else "D"

    def is_moving(self, port: int, now: float) -> bool:
        return self.moving_until.get(port, -1.0) > now

    def power_dbm(self, port: int, now: float) -> float:
        """What the port's monitor reads: ingress = arriving light, egress = light through the circuit."""
        if port <= self.size:
            if self.port_state(port) != "E":
                return DARK_DBM
            if port in self.input_power:
                return self.input_power[port]
            feed = self.input_feeds.get(port)
            arriving = feed(now) if feed is not None else None
            return DARK_DBM if arriving is None else arriving
        # The egress path inlined (no port_state / is_moving calls): a PMON query of a 256-port switch
        # reads 256 of these, and eight switches share one twin process.
        ingress = self.conn_to.get(port)
        if ingress is None or port in self.failed or not self.enabled[port]:
            return DARK_DBM
        moving = self.moving_until
        if moving.get(ingress, -1.0) > now or moving.get(port, -1.0) > now:
            return DARK_DBM
        arriving = self.power_dbm(ingress, now)
        return DARK_DBM if arriving == DARK_DBM else arriving - self.spec.insertion_loss_db

    def operations_complete_at(self, now: float) -> float:
        return max(now, self._latest_move)  # the latest move's end, kept by _apply

    def reset_device(self, now: float) -> None:
        # *RST: "reset the instrument and disconnect all connections"; a failed port stays failed.
        self._apply({}, now)
        self._enable([p for p in self._all_ports() if not self.enabled[p]], True, "scpi *RST")

    # ---- the switch model, for the other front ends (TL1, NETCONF: emulators/frontends.py) -------
    # One switch, several management interfaces, as a real switch has: every front end changes the same
    # circuits, with the same switching time, dark moving ports and light.

    def circuits(self) -> dict[int, int]:
        return dict(self.conn)

    def connect_pairs(self, pairs, now: float) -> None:
        """Add circuits (an ingress already connected is re-pointed), all moving at once."""
        pairs = [(int(i), int(e)) for i, e in pairs]
        self._check_pairs(pairs)
        new = dict(self.conn)
        new.update(pairs)
        owners: dict[int, int] = {}
        for i, e in new.items():
            if owners.setdefault(e, i) != i:
                raise SwitchRefused(f"egress {e} is already connected to ingress {owners[e]}")
        self._apply(new, now)

    def replace_circuits(self, pairs, now: float) -> None:
        """Hold exactly these circuits (the rest removed), all moving at once."""
        pairs = [(int(i), int(e)) for i, e in pairs]
        self._check_pairs(pairs)
        self._apply(dict(pairs), now)

    def disconnect_ports(self, ports, now: float) -> None:
        """Remove the circuits on these ports (ingress or egress); a port without a circuit is ignored."""
        ports = {int(p) for p in ports}
        bad = sorted(p for p in ports if not 1 <= p <= 2 * self.size)
        if bad:
            raise SwitchRefused(f"port {bad[0]} is not in 1..{2 * self.size}")
        self._apply({i: e for i, e in self.conn.items() if i not in ports and e not in ports}, now)

    def set_ports_enabled(self, ports, enabled: bool, via: str = "") -> None:
        """Take ports out of service (no light through them; their circuits stay) or back, all or none."""
        ports = [int(p) for p in ports]
        bad = sorted(p for p in ports if not 1 <= p <= 2 * self.size)
        if bad:
            raise SwitchRefused(f"port {bad[0]} is not in 1..{2 * self.size}")
        self._enable(ports, enabled, via)

    def _enable(self, ports: list[int], enabled: bool, via: str) -> None:
        """Set the ports' administrative state; the ground truth logs the moment, as the switch applied it."""
        for p in ports:
            self.enabled[p] = enabled
        if ports and self.truth is not None:
            state = "enabled" if enabled else "disabled"
            self.truth.record("port", switch=self.spec.name, ports=sorted(set(ports)), state=state, via=via)

    def _check_pairs(self, pairs: list[tuple[int, int]]) -> None:
        n = self.size
        for i, e in pairs:
            if not 1 <= i <= n:
                raise SwitchRefused(f"ingress {i} is not in 1..{n}")
            if not n < e <= 2 * n:
                raise SwitchRefused(f"egress {e} is not in {n + 1}..{2 * n}")
        for index, what in ((0, "ingress"), (1, "egress")):
            seen = [p[index] for p in pairs]
            if len(set(seen)) < len(seen):
                raise SwitchRefused(f"an {what} port is listed twice")

    # ---- helpers ------------------------------------------------------------------------------

    def _all_ports(self) -> range:
        return range(1, 2 * self.size + 1)

    def _check_port(self, port: int) -> int:
        if not isinstance(port, int) or not 1 <= port <= 2 * self.size:
            raise ValueError(f"port {port!r} out of range 1..{2 * self.size}")
        return port

    def _ports(self, text: str, lo: int, hi: int) -> list[int]:
        ports = parse_channel_list(text, allow_ranges=self.allow_ranges)
        if ports and not lo <= min(ports) <= max(ports) <= hi:
            bad = next(p for p in ports if not lo <= p <= hi)
            raise ScpiError(-222, f"port {bad} not in {lo}..{hi}")
        return ports

    def _pairs(self, call: Call) -> list[tuple[int, int]]:
        ingress, egress = self._ingress_egress(call)
        return self._paired(ingress, egress)

    def _ingress_egress(self, call: Call) -> tuple[list[int], list[int]]:
        n = self.size
        ingress = self._ports(call.args[0], 1, n)
        egress = self._ports(call.args[1], n + 1, 2 * n) if len(call.args) > 1 else []
        return ingress, egress

    @staticmethod
    def _paired(ingress: list[int], egress: list[int]) -> list[tuple[int, int]]:
        if len(egress) < len(ingress):
            raise ScpiError(-109, "fewer egress than ingress ports")
        if len(egress) > len(ingress):
            raise ScpiError(-224, "more egress than ingress ports")
        if len(set(ingress)) < len(ingress) or len(set(egress)) < len(egress):
            raise ScpiError(-224, "a port is listed twice")
        return list(zip(ingress, egress, strict=True))

    def _apply(self, new: dict[int, int], now: float) -> None:
        """Switch to connection map `new`; every port whose peer changes starts one move."""
        # The circuits that differ, both the old and the new ones, as sets of pairs (a 256-port change
        # is diffed in C, not in 512 dictionary lookups): their ports are the ones that move.
        differ = self.conn.items() ^ new.items()
        if not differ:
            return
        ports = {p for pair in differ for p in pair}
        jitter = self.rng.uniform(-self.jitter_ms, self.jitter_ms)
        until = now + max(0.0, self.switching_time_ms + jitter) / 1000.0
        moving = self.moving_until
        if self._latest_move <= until:
            moving.update(dict.fromkeys(ports, until))
        else:  # jitter or a shorter switching time: a port still moving for longer keeps its later time
            for p in ports:
                if moving.get(p, until) <= until:
                    moving[p] = until
        self._latest_move = max(self._latest_move, until)
        self.conn = new
        self.conn_to = {e: i for i, e in new.items()}

    def _checked_map(self, new: dict[int, int]) -> dict[int, int]:
        owners: dict[int, int] = {}
        for i, e in new.items():
            if e in owners:
                raise ScpiError(-221, f"egress {e} is already connected to {owners[e]}")
            owners[e] = i
        return new

    # ---- SCPI commands --------------------------------------------------------------------------

    def _register_commands(self) -> None:
        reg = self.register
        reg(":OXC:SWITch:SIZE?", lambda c: f"{self.size},{self.size}")
        reg(":OXC:SWITch:CONNect:ADD", self._add, args=(2, 3))
        reg(":OXC:SWITch:CONNect:ONLY", self._only, args=(2, 3))
        reg(":OXC:SWITch:CONNect:SUB", self._sub, args=(1, 3))
        reg(":OXC:SWITch:CONNect:STATe?", self._conn_state)
        reg(":OXC:SWITch:CONNect:PORT?", self._conn_port, args=(1, 1))
        reg(":OXC:SWITch:DISConnect:ALL", lambda c: self._apply({}, c.now))
        reg(":OXC:SWITch:PORT:DISable", lambda c: self._set_enabled(c, False), args=(1, 1))
        reg(":OXC:SWITch:PORT:ENABle", lambda c: self._set_enabled(c, True), args=(1, 1))
        reg(":OXC:SWITch:PORT:STATe?", self._port_states, args=(1, 1))
        reg(":PMON:POWer?", self._power, args=(1, 1))
        reg(":OXC:BOOT:MODE", self._set_boot_mode, args=(1, 1))
        reg(":OXC:BOOT:MODE?", lambda c: _BOOT_MODE_SHORT[self.boot_mode])
        reg(":SYSTem:COMMunicate:NETWork#:ADDRess?", lambda c: self._network_address())

    def _add(self, call: Call) -> None:
        new = dict(self.conn)
        new.update(self._pairs(call))  # an ingress already connected is re-pointed
        self._apply(self._checked_map(new), call.now)

    def _only(self, call: Call) -> None:
        self._apply(self._checked_map(dict(self._pairs(call))), call.now)

    def _sub(self, call: Call) -> None:
        new = dict(self.conn)
        ingress, egress = self._ingress_egress(call)
        if not egress:  # each ingress port's circuit, whatever its egress
            for i in ingress:
                new.pop(i, None)
        else:
            for i, e in self._paired(ingress, egress):
                if new.get(i) == e:
                    del new[i]
        self._apply(new, call.now)

    def _conn_state(self, call: Call) -> str:
        pairs = sorted(self.conn.items())
        return f"(@{','.join(str(i) for i, _ in pairs)}),(@{','.join(str(e) for _, e in pairs)})"

    def _conn_port(self, call: Call) -> str:
        text = call.args[0]
        ports = self._ports(text, 1, 2 * self.size) if text.startswith("(") else [parse_int(text)]
        if len(ports) != 1:
            raise ScpiError(-224, "exactly one port expected")
        port = ports[0]
        if not 1 <= port <= 2 * self.size:
            raise ScpiError(-222, f"port {port} not in 1..{2 * self.size}")
        peer = self.conn.get(port) or self.conn_to.get(port)
        answer = "" if peer is None else str(peer)
        return f'"{answer}"' if self.quote_port_reply else answer

    def _set_enabled(self, call: Call, enabled: bool) -> None:
        # A port out of range refuses the whole command (-222) before any port changes.
        self._enable(self._ports(call.args[0], 1, 2 * self.size), enabled, "scpi")

    def _port_states(self, call: Call) -> str:
        ports = self._ports(call.args[0], 1, 2 * self.size)
        return "(" + ",".join(self.port_state(p) for p in ports) + ")"

    def _power(self, call: Call) -> str:
        ports = self._ports(call.args[0], 1, 2 * self.size)
        power, now = self.power_dbm, call.now
        # Levels repeat (dark ports, one launch power through equal losses): each is formatted once.
        values = [power(p, now) for p in ports]
        text = {v: f"{v:.2f}" for v in set(values)}
        return ",".join([text[v] for v in values])

    def _set_boot_mode(self, call: Call) -> None:
        self.boot_mode = parse_choice(call.args[0], ["DARK", "RESTore", "AUTosave"])

    def _network_address(self) -> str:
        return 'IP="127.0.0.1" Gateway="0.0.0.0" Mask="255.0.0.0" Broadcast="127.255.255.255"'
