"""HUBER+SUHNER Polatis optical circuit switch over TL1 (docs/protocols.md §8): driver `polatis-tl1`.

Ports are numbers: ingress 1..N, egress N+1..2N; port lists are `1&2&7`, ranges `1&&4`. Choices:
- circuits are entered as lists, `ENT-PATCH::1&2,17&18:<ctag>:;`, one command for up to `max_batch` pairs
  (one move), lower port first in each pair as Quali's driver sends them; lists in ENT-PATCH are standard
  TL1 grouping but unconfirmed on Polatis: `max_batch=1` sends one pair per command;
- disconnect((i, e)) deletes the patch on ingress i (`DLT-PATCH` deletes by port, whatever the peer);
- TL1 has no `*OPC?`: the emulated switch answers a move's COMPLD once the mirrors have settled, so
  wait_settled() waits for the answers still due and then checks that the session answers (RTRV-HDR);
- every command is answered; a write sent with check=False is not waited for (its CTAG is kept), so the
  disconnect and connect of one change are in flight together and their moves overlap, as over SCPI;
  check_errors() collects the answers and raises for the refused ones;
- port states: E/D from the shutters (RTRV-PORT-SHUTTER: OPEN/CLOSED), F from the standing port alarms
  (RTRV-ALM-ALL).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence

from drivers.capabilities import CircuitSwitch, Identity, PortControl
from drivers.errors import DeviceProtocolError, switch_ports_hint
from drivers.transports.tl1 import Tl1Transport
from drivers.transports.tl1_messages import Tl1Message
from drivers.transports.tl1_refusals import Tl1Denied, combined_refusals

_SIZE = re.compile(r"SIZE=(\d+)x(\d+)", re.IGNORECASE)
_SERIAL = re.compile(r"SN=([^,\s]+)")
_PORT_VALUE = re.compile(r"^\s*(\d+)\s*:\s*(\S+?)\s*$")
_PATCH = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*$")
_ALARM = re.compile(r"^\s*(\d+)\s*(?:,[^:]*)?:\s*([A-Z]{2})\s*,\s*([A-Z0-9-]+)")
DARK_DBM = -99.99


class PolatisTl1(CircuitSwitch, PortControl):
    """A Polatis switch over TL1 (CircuitSwitch capability)."""

    def __init__(self, transport: Tl1Transport, device: str, *, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.transport = transport
        self.device = device
        self.max_batch = max_batch
        self._size: tuple[int, int] | None = None
        self._in_flight: list[str] = []  # CTAGs of writes sent with check=False, not yet answered
        self._deferred: list[Tl1Denied] = []  # refusals of writes sent with check=False

    # -- identity and geometry ----------------------------------------------------------------------------

    def identify(self) -> Identity:
        netype = self._query("RTRV-NETYPE", "")
        fields = [f.strip() for f in _first(netype).split(",")]
        if len(fields) != 4 or not all(fields):
            raise self._protocol(netype, 'expected "<vendor>,<model>,<type>,<version>"')
        inventory = self._query("RTRV-INV", "OCS")
        m = _SERIAL.search(" ".join(inventory.content))
        if not m:
            raise self._protocol(inventory, "expected the serial number as SN=<serial>")
        return Identity(fields[0], fields[1], m.group(1), fields[3])

    def size(self) -> tuple[int, int]:
        reply = self._query("RTRV-EQPT", "SYSTEM", "", "", "PARAMETER=SIZE")
        m = _SIZE.search(" ".join(reply.content))
        if not m:
            raise self._protocol(reply, 'expected "SYSTEM:SIZE=<N>x<M>"')
        self._size = (int(m.group(1)), int(m.group(2)))
        return self._size

    # -- circuits -----------------------------------------------------------------------------------------

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        ordered = [tuple(sorted((operator.index(a), operator.index(b)))) for a, b in pairs]
        aids = []
        for start in range(0, len(ordered), self.max_batch):
            batch = ordered[start : start + self.max_batch]
            aids.append(f"{port_list([i for i, _ in batch])},{port_list([e for _, e in batch])}")
        self._write("ENT-PATCH", aids, check=check)

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        ingress = [min(operator.index(a), operator.index(b)) for a, b in pairs]
        batches = [port_list(ingress[i : i + self.max_batch]) for i in range(0, len(ingress), self.max_batch)]
        self._write("DLT-PATCH", batches, check=check)

    def check_errors(self, after: str = "the previous commands") -> None:
        """Wait for the answers to the writes sent with check=False; raise DeviceCommandError for the refused."""
        self._land()
        deferred, self._deferred = self._deferred, []
        if deferred:
            raise combined_refusals(deferred, after, self.device, self.transport.address)

    def disconnect_all(self) -> None:
        self._write("DLT-PATCH", ["ALL"])

    def wait_settled(self) -> None:
        self._land()  # a write's COMPLD comes once its move has settled
        self._query("RTRV-HDR", "")

    def connections(self) -> dict[int, int]:
        reply = self._query("RTRV-PATCH", "")
        found: dict[int, int] = {}
        for line in reply.content:
            m = _PATCH.match(line)
            if not m:
                raise self._protocol(reply, 'expected one "<ingress>,<egress>" line per patch')
            a, b = int(m.group(1)), int(m.group(2))
            found[min(a, b)] = max(a, b)
        return found

    # -- ports ----------------------------------------------------------------------------------------------

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        wanted = _ports(ports)
        if not wanted:
            return {}
        reply = self._query("RTRV-PORT-POWER", port_list(wanted))
        values = self._port_values(reply, wanted, "<port>:<dBm>")
        try:
            return {p: float(v) for p, v in values.items()}
        except ValueError:
            raise self._protocol(reply, 'expected "<port>:<dBm>" with a number in dBm') from None

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        wanted = _ports(ports)
        if wanted:
            self._write("RLS-PORT-SHUTTER" if enabled else "OPR-PORT-SHUTTER", [port_list(wanted)])

    def port_states(self, ports: Iterable[int]) -> dict[int, str]:
        wanted = _ports(ports)
        if not wanted:
            return {}
        reply = self._query("RTRV-PORT-SHUTTER", port_list(wanted))
        shutters = self._port_values(reply, wanted, "<port>:OPEN|CLOSED")
        states = {}
        for port, shutter in shutters.items():
            if shutter.upper() not in ("OPEN", "CLOSED"):
                raise self._protocol(reply, f'expected OPEN or CLOSED for port {port}, got "{shutter}"')
            states[port] = "E" if shutter.upper() == "OPEN" else "D"
        alarms = self._query("RTRV-ALM-ALL", "")
        for line in alarms.content:
            m = _ALARM.match(line)
            if m and int(m.group(1)) in states and m.group(2) != "CL" and m.group(3) == "FAIL":
                states[int(m.group(1))] = "F"
        return states

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> PolatisTl1:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------

    def _query(self, verb: str, aid: str, *blocks: str) -> Tl1Message:
        return self.transport.command(verb, aid, *(blocks or ("",)))

    def _write(self, verb: str, aids: list[str], *, check: bool = True) -> None:
        """One command per AID, all in flight at once (their moves overlap); with check=False the answers are
        collected by the next check_errors() or wait_settled().
        """
        ctags = [self.transport.send(verb, aid, "") for aid in aids]
        if not check:
            self._in_flight += ctags
            return
        refused = [self._with_ranges(r) for r in self.transport.collect(ctags) if isinstance(r, Tl1Denied)]
        if refused:
            raise combined_refusals(refused, f"{len(ctags)} {verb} commands", self.device, self.transport.address)

    def _land(self) -> None:
        ctags, self._in_flight = self._in_flight, []
        self._deferred += [self._with_ranges(r) for r in self.transport.collect(ctags) if isinstance(r, Tl1Denied)]

    def _with_ranges(self, err: Tl1Denied) -> Tl1Denied:
        """A port the switch does not have: say which ports it has (asking it once, if need be)."""
        if err.code != "IIAC":
            return err
        hint = switch_ports_hint(self._size, self.size)
        if hint is None:
            return err
        return Tl1Denied(
            err.message,
            code=err.code,
            response=err.response,
            device=err.device,
            address=err.address,
            sent=err.sent,
            received=err.received,
            hint=hint,
        )

    def _port_values(self, reply: Tl1Message, wanted: Sequence[int], form: str) -> dict[int, str]:
        found: dict[int, str] = {}
        for line in reply.content:
            m = _PORT_VALUE.match(line)
            if not m:
                raise self._protocol(reply, f'expected one "{form}" line per port')
            found[int(m.group(1))] = m.group(2)
        missing = [p for p in wanted if p not in found]
        if missing:
            raise self._protocol(reply, f"no value for port(s) {missing[:8]}")
        return {p: found[p] for p in wanted}

    def _protocol(self, reply: Tl1Message, expected: str) -> DeviceProtocolError:
        return DeviceProtocolError(
            f"unexpected response: {expected}",
            device=self.device,
            address=self.transport.address,
            sent=self.transport.last_sent,
            received=reply.text.strip(),
            hint="is this a Polatis switch speaking TL1 (port 3082)? its firmware may format this differently",
        )


def port_list(ports: Sequence[int]) -> str:
    """`1&2&7`; a run of three or more consecutive ports becomes a range `1&&4` (shorter for big lists)."""
    items: list[str] = []
    i = 0
    while i < len(ports):
        j = i
        while j + 1 < len(ports) and ports[j + 1] == ports[j] + 1:
            j += 1
        if j - i >= 2:
            items.append(f"{ports[i]}&&{ports[j]}")
        else:
            items.extend(str(p) for p in ports[i : j + 1])
        i = j + 1
    return "&".join(items)


def _ports(ports: Iterable[int]) -> list[int]:
    # operator.index: a float or a string must fail here, not go out on the wire as "3.0" or "'3'"
    return [operator.index(p) for p in ports]


def _first(reply: Tl1Message) -> str:
    return reply.content[0] if reply.content else ""
