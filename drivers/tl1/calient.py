"""Calient S-series optical circuit switch over TL1 (docs/protocols.md §8): driver `calient-tl1`.

A Calient has P bidirectional ports named `<shelf>.<slot>.<port>`. The CircuitSwitch view is P x P:
ingress k is the input side of the k-th port, egress P+k the output side of the k-th port, so a circuit
(i, P+j) is the one-way cross-connect from port i's input to port j's output (`i>j`).

The k-th port's name follows this project's numbering (`aid_of`: 8 ports per slot, 8 slots per shelf,
the shape of the names in Quali's recorded replies); the audit model (drivers/tl1/audit.py) reads the audit
log with the same numbering, so the driver checks it against the switch's own port list (RTRV-PORT) once
and refuses to go on if the switch names its ports otherwise.

A cross-connect is made in two steps, as Quali's driver does: ENT-CRS enters it, ACT-CRS activates it (the
mirrors move); it is removed with CANC-CRS (deactivate) then DLT-CRS (delete). One command per
cross-connect (lists of cross-connects in one command are not known to work on a Calient), but all of one
call in flight at once, matched by CTAG, so their moves overlap. A cross-connect whose activation the switch
refuses is deleted again, so the switch keeps no half-made entry. With check=False nothing is waited for:
check_errors() or wait_settled() collects the answers (the emulated switch sends COMPLD for ACT-CRS and
CANC-CRS once the move has settled) and check_errors() raises for the refused.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable

from drivers.capabilities import CircuitSwitch, Identity, PortControl
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.transports.tl1 import Tl1Transport
from drivers.transports.tl1_messages import Tl1Message
from drivers.transports.tl1_refusals import Tl1Denied, combined_refusals

PORTS_PER_SLOT = 8
SLOTS_PER_SHELF = 8
GROUP = "testbed"  # the cross-connect group the driver enters its connections in (Quali uses "Quali")
DARK_DBM = -99.99  # what a port without a power reading (INPWR=NONE) is taken as
CALIENT_TL1_PORT = 3083  # Quali's runtime configuration (a Lawo driver page says 3082 "TL1-RAW")
_KEYS = re.compile(r"([A-Z][A-Z0-9]*)=([^,]*)")
_PORT_LINE = re.compile(r"^\s*(\d+\.\d+\.\d+)\s*:(.*)$")
_NE = re.compile(r"SERIALNUMBER=([^,]+),SWPACKAGE=([^,]+),.*CHASSISTYPE=([^,]+)")


def aid_of(k: int) -> str:
    """The name of the k-th port (1-based): 1.1.1 .. 1.1.8, 1.2.1 .. 1.8.8, 2.1.1 .."""
    shelf, rest = divmod(k - 1, PORTS_PER_SLOT * SLOTS_PER_SHELF)
    slot, port = divmod(rest, PORTS_PER_SLOT)
    return f"{shelf + 1}.{slot + 1}.{port + 1}"


def port_of(aid: str) -> int | None:
    """The inverse of aid_of, or None for a name that is not one of its."""
    m = re.fullmatch(r"(\d{1,4})\.(\d{1,4})\.(\d{1,4})", aid.strip())
    if not m:
        return None
    shelf, slot, port = (int(x) for x in m.groups())
    if shelf < 1 or not 1 <= slot <= SLOTS_PER_SHELF or not 1 <= port <= PORTS_PER_SLOT:
        return None
    return ((shelf - 1) * SLOTS_PER_SHELF + slot - 1) * PORTS_PER_SLOT + port


class CalientTl1(CircuitSwitch, PortControl):
    """A Calient switch over TL1 (CircuitSwitch capability)."""

    def __init__(self, transport: Tl1Transport, device: str) -> None:
        self.transport = transport
        self.device = device
        self._ports: int | None = None  # P, from the switch's port list
        # Sent with check=False: each entry collects its answers and returns the refusals
        self._in_flight: list[Callable[[], list[Tl1Denied]]] = []
        self._deferred: list[Tl1Denied] = []

    # -- identity and geometry ----------------------------------------------------------------------------

    def identify(self) -> Identity:
        reply = self._query("RTRV-NE", "")
        m = _NE.search(" ".join(reply.content))
        if not m:
            raise self._protocol(reply, 'expected "...SERIALNUMBER=<s>,SWPACKAGE=<v>,...,CHASSISTYPE=<model>..."')
        serial, firmware, model = (x.strip() for x in m.groups())
        return Identity("Calient", model, serial, firmware)

    def size(self) -> tuple[int, int]:
        reply = self._query("RTRV-PORT", "0")  # Quali lists every port with aid 0
        names = []
        for line in reply.content:
            m = _PORT_LINE.match(line)
            if not m:
                raise self._protocol(reply, 'expected one "<shelf>.<slot>.<port>:..." line per port')
            names.append(m.group(1))
        ordered = sorted(names, key=lambda a: tuple(int(x) for x in a.split(".")))
        expected = [aid_of(k) for k in range(1, len(names) + 1)]
        if not names or ordered != expected:
            raise DeviceProtocolError(
                f"the switch names its {len(names)} ports otherwise than this driver numbers them",
                device=self.device,
                address=self.transport.address,
                sent=self.transport.last_sent,
                received=", ".join(ordered[:12]) + (" ..." if len(ordered) > 12 else ""),
                hint=f"the driver (and its audit model) number port k as <shelf>.<slot>.<port> with "
                f"{PORTS_PER_SLOT} ports per slot and {SLOTS_PER_SHELF} slots per shelf (1.1.1, 1.1.2, ...); "
                "this switch needs a driver with its own numbering",
            )
        self._ports = len(names)
        return self._ports, self._ports

    # -- circuits -----------------------------------------------------------------------------------------

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        ends = [self._cross_connect(a, b) for a, b in pairs]  # all checked before anything is sent
        send = self.transport.send
        ctags = [
            (send("ENT-CRS", f"{s},{d}", "", f"{GROUP},1WAY"), send("ACT-CRS", f"{s},{d}", "", f"{s}>{d},{GROUP}"))
            for s, d in ends
        ]

        def land() -> list[Tl1Denied]:
            results = self.transport.collect([c for pair in ctags for c in pair])
            refused, unmade = [], []
            for (s, d), entered, activated in zip(ends, results[::2], results[1::2], strict=True):
                if isinstance(entered, Tl1Denied):
                    refused.append(entered)  # its ACT-CRS was refused too, for want of the entry
                elif isinstance(activated, Tl1Denied):
                    refused.append(activated)
                    unmade.append(self.transport.send("DLT-CRS", f"{s},{d}", "", f",{GROUP},{s}>{d}"))
            self.transport.collect(unmade)  # best effort: the refusal is what matters
            return refused

        self._finish(land, check, "connect")

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        ends = [self._cross_connect(a, b) for a, b in pairs]
        self._finish(self._remove([(s, d, True) for s, d in ends]), check, "disconnect")

    def check_errors(self, after: str = "the previous commands") -> None:
        self._land()
        deferred, self._deferred = self._deferred, []
        if deferred:
            raise combined_refusals(deferred, after, self.device, self.transport.address)

    def disconnect_all(self) -> None:
        self._finish(self._remove([(s, d, active) for s, d, active, _ in self._cross_connects()]), True, "")

    def wait_settled(self) -> None:
        self._land()  # ACT-CRS and CANC-CRS are answered once their moves have settled
        self._query("RTRV-HDR", "")

    def connections(self) -> dict[int, int]:
        p = self._size()
        found: dict[int, int] = {}
        for src, dst, active, two_way in self._cross_connects():
            if active:
                i, j = self._number(src), self._number(dst)
                found[i] = p + j
                if two_way:
                    found[j] = p + i
        return found

    # -- ports ----------------------------------------------------------------------------------------------

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        wanted = [operator.index(p) for p in ports]
        if not wanted:
            return {}
        sides = {p: self._side(p) for p in wanted}
        reply = self._query("RTRV-PORT-SUM", "&".join(dict.fromkeys(aid for aid, _ in sides.values())))
        summary = self._per_port(reply, "<port>:...,INPWR=<dBm>,OUTPWR=<dBm>,...")
        result = {}
        for p, (aid, side) in sides.items():
            value = summary.get(aid, {}).get("INPWR" if side == "IN" else "OUTPWR")
            if value is None:
                raise self._protocol(reply, f"no {side}PWR for port {aid}")
            try:
                result[p] = DARK_DBM if value.upper() == "NONE" else float(value)
            except ValueError:
                raise self._protocol(reply, f"{side}PWR of {aid} is not a number: {value!r}") from None
        return result

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        by_side: dict[str, list[str]] = {"IN": [], "OUT": []}
        for p in ports:
            aid, side = self._side(operator.index(p))
            by_side[side].append(aid)
        for side, aids in by_side.items():
            if aids:
                value = "IS" if enabled else "OOS"
                self.transport.command("ED-PORT", "&".join(dict.fromkeys(aids)), "", "", f"{side}AS={value}")

    def port_states(self, ports: Iterable[int]) -> dict[int, str]:
        wanted = [operator.index(p) for p in ports]
        if not wanted:
            return {}
        sides = {p: self._side(p) for p in wanted}
        reply = self._query("RTRV-PORT", "&".join(dict.fromkeys(aid for aid, _ in sides.values())))
        states = self._per_port(reply, "<port>:<type>,..:INAS=..,INOS=..,INOC=..,..,OUTAS=..")
        result = {}
        for p, (aid, side) in sides.items():
            fields = states.get(aid, {})
            admin, condition = fields.get(f"{side}AS"), fields.get(f"{side}OC")
            if admin is None or condition is None:
                raise self._protocol(reply, f"no {side}AS / {side}OC for port {aid}")
            result[p] = "F" if condition.upper() == "FAIL" else "E" if admin.upper() == "IS" else "D"
        return result

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> CalientTl1:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------

    def _size(self) -> int:
        if self._ports is None:
            self.size()
        assert self._ports is not None
        return self._ports

    def _side(self, port: int) -> tuple[str, str]:
        """(port name, "IN" or "OUT") of a CircuitSwitch port number."""
        p = self._size()
        if 1 <= port <= p:
            return aid_of(port), "IN"
        if p < port <= 2 * p:
            return aid_of(port - p), "OUT"
        raise self._range_error(f"port {port}", port)

    def _cross_connect(self, a: int, b: int) -> tuple[str, str]:
        """(source, destination) port names of circuit (a, b), in either order."""
        p = self._size()
        i, e = sorted((operator.index(a), operator.index(b)))
        if not (1 <= i <= p < e <= 2 * p):
            raise self._range_error(f"circuit ({a}, {b})", e if 1 <= i <= p else i)
        return aid_of(i), aid_of(e - p)

    def _number(self, aid: str) -> int:
        k = port_of(aid)
        if k is None or k > self._size():
            raise DeviceProtocolError(
                f"the switch reports a cross-connect on port {aid!r}, which it did not list",
                device=self.device,
                address=self.transport.address,
                sent=self.transport.last_sent,
                hint="re-read the switch's ports (a card may have been added); reconnect the driver",
            )
        return k

    def _range_error(self, what: str, port: int) -> DeviceCommandError:
        p = self._size()
        return DeviceCommandError(
            f"{what}: port {port} is not on this switch, nothing was sent",
            device=self.device,
            address=self.transport.address,
            hint=f"ports must be ingress 1..{p} (port inputs) and egress {p + 1}..{2 * p} (port outputs) on this "
            f"{p}-port switch (and allowed in the inventory)",
        )

    def _remove(self, connections: list[tuple[str, str, bool]]) -> Callable[[], list[Tl1Denied]]:
        """Send CANC-CRS (for the active ones) and DLT-CRS for each; returns what collects the answers."""
        send, sent = self.transport.send, []
        for s, d, active in connections:
            cancel = send("CANC-CRS", f"{s},{d}", "", f",{GROUP},{s}>{d}") if active else None
            sent.append((cancel, send("DLT-CRS", f"{s},{d}", "", f",{GROUP},{s}>{d}")))

        def land() -> list[Tl1Denied]:
            results = iter(self.transport.collect([c for pair in sent for c in pair if c is not None]))
            refused = []
            for cancel, _ in sent:
                first = next(results) if cancel is not None else None
                deleted = next(results)
                # the first refusal of each tells the story (a refused CANC-CRS makes DLT-CRS refused too)
                why = first if isinstance(first, Tl1Denied) else deleted if isinstance(deleted, Tl1Denied) else None
                if why is not None:
                    refused.append(why)
            return refused

        return land

    def _finish(self, land: Callable[[], list[Tl1Denied]], check: bool, what: str) -> None:
        if not check:
            self._in_flight.append(land)
            return
        refused = land()
        if refused:
            raise combined_refusals(refused, f"the {what or 'removal'}", self.device, self.transport.address)

    def _land(self) -> None:
        in_flight, self._in_flight = self._in_flight, []
        for land in in_flight:
            self._deferred += land()

    def _cross_connects(self) -> list[tuple[str, str, bool, bool]]:
        """(source, destination, active, two-way) of every cross-connect the switch lists."""
        reply = self._query("RTRV-CRS", "", "", "ALL")
        found = []
        for line in reply.content:
            fields = dict(_KEYS.findall(line.partition(":")[2]))
            if "SRCPORT" not in fields or "DSTPORT" not in fields:
                raise self._protocol(reply, 'expected "<name>:SRCPORT=<port>,DSTPORT=<port>,...,OS=<state>,..."')
            # OS=PND is how the emulator shows one entered but not activated; anything else counts as active
            active = fields.get("OS", "").upper() != "PND"
            two_way = fields.get("CONNTYPE", "1WAY").upper() == "2WAY"
            found.append((fields["SRCPORT"].strip(), fields["DSTPORT"].strip(), active, two_way))
        return found

    def _query(self, verb: str, aid: str, *blocks: str) -> Tl1Message:
        return self.transport.command(verb, aid, *blocks)

    def _per_port(self, reply: Tl1Message, form: str) -> dict[str, dict[str, str]]:
        found = {}
        for line in reply.content:
            m = _PORT_LINE.match(line)
            if not m:
                raise self._protocol(reply, f'expected one "{form}" line per port')
            found[m.group(1)] = {k: v.strip() for k, v in _KEYS.findall(m.group(2))}
        return found

    def _protocol(self, reply: Tl1Message, expected: str) -> DeviceProtocolError:
        return DeviceProtocolError(
            f"unexpected response: {expected}",
            device=self.device,
            address=self.transport.address,
            sent=self.transport.last_sent,
            received=reply.text.strip(),
            hint="is this a Calient switch speaking TL1 (port 3083)? its firmware may format this differently",
        )
