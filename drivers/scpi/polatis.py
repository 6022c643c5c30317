"""HUBER+SUHNER Polatis optical circuit switch over SCPI (docs/protocols.md §1).

Grammar only: framing, timeouts and reconnection belong to the transport. Deliberate choices:
- set-commands get no reply in SCPI, so they go through `transport.write` (a `query` would time out);
  success is learnt from the error queue (`:SYST:ERR?`) right after, when `check_errors` is on;
- one query per message: whether Polatis joins compound answers with ";" or sends one line each is
  unverified, so nothing here depends on it;
- a query the switch rejects gets no reply at all (SCPI queues the error instead), so a timeout on a
  query that names ports is followed by one look at the error queue.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence

from drivers.capabilities import CircuitSwitch, Identity, PortControl
from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError, DeviceTimeout, switch_ports_hint
from drivers.transports import MessageTransport

PMON_CHUNK = 256  # ports per :PMON:POW? query; the vendor's own library chunks at this size
MAX_ERROR_READS = 32  # bound on draining the error queue (real queues hold 10-30 entries)
PORT_STATES = frozenset("EDF")  # enabled, disabled, failed

_CONN_STAT = re.compile(r"^\(@([^)]*)\)\s*,\s*\(@([^)]*)\)$")
_ERROR = re.compile(r"^([+-]?\d+)\s*(?:,\s*(.*))?$")


class PolatisScpi(CircuitSwitch, PortControl):
    """A Polatis switch (CircuitSwitch capability). Ingress ports 1..N, egress N+1..N+M."""

    def __init__(self, transport: MessageTransport, device: str, *, check_errors: bool = True) -> None:
        self.transport = transport
        self.device = device
        self.auto_check_errors = check_errors
        self._size: tuple[int, int] | None = None  # cached for error hints; the size never changes

    # -- identity and geometry --------------------------------------------------------------------

    def identify(self) -> Identity:
        reply = self._query("*IDN?")
        fields = [f.strip() for f in reply.split(",")]
        if len(fields) != 4:
            raise self._protocol("*IDN?", reply, "expected 4 comma-separated fields vendor,model,serial,firmware")
        return Identity(*fields)

    def size(self) -> tuple[int, int]:
        reply = self._query(":OXC:SWIT:SIZE?")
        try:
            ins, outs = (int(f) for f in reply.split(","))
        except ValueError:
            raise self._protocol(":OXC:SWIT:SIZE?", reply, "expected 'inputs,outputs' such as '16,16'") from None
        self._size = (ins, outs)
        return self._size

    # -- circuits ---------------------------------------------------------------------------------

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        self._circuit_command(":OXC:SWIT:CONN:ADD", pairs, check)

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        self._circuit_command(":OXC:SWIT:CONN:SUB", pairs, check)

    def check_errors(self, after: str = "the previous commands") -> None:
        """Raise DeviceCommandError if the switch queued errors (for writes sent with check=False)."""
        errors = self._drain_errors()
        if errors:
            raise self._command_error(after, errors)

    def disconnect_all(self) -> None:
        self._write(":OXC:SWIT:DISC:ALL")

    def wait_settled(self) -> None:
        # *OPC? answers only once the mirrors have stopped moving; the transport's timeout bounds it.
        reply = self._query("*OPC?")
        if reply.strip() != "1":
            raise self._protocol("*OPC?", reply, "expected '1'")

    def connections(self) -> dict[int, int]:
        cmd = ":OXC:SWIT:CONN:STAT?"
        reply = self._query(cmd)
        m = _CONN_STAT.match(reply.strip())
        if not m:
            raise self._protocol(cmd, reply, "expected '(@i1,i2,..),(@e1,e2,..)', or '(@),(@)' when empty")
        ingress, egress = (self._ints(cmd, reply, group) for group in m.groups())
        if len(ingress) != len(egress):
            raise self._protocol(cmd, reply, "the ingress and egress lists differ in length")
        return dict(zip(ingress, egress, strict=True))

    # -- ports ------------------------------------------------------------------------------------

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        result: dict[int, float] = {}
        for chunk in _chunks(_ports(ports), PMON_CHUNK):
            cmd = f":PMON:POW? {_chanlist(chunk)}"
            reply = self._query(cmd, has_ports=True)
            values = _unwrap(reply).split(",")
            try:
                powers = [float(v) for v in values]
            except ValueError:
                raise self._protocol(cmd, reply, "expected a comma-separated list of dBm values") from None
            if len(powers) != len(chunk):
                raise self._protocol(cmd, reply, f"expected {len(chunk)} values, one per port, got {len(powers)}")
            result.update(zip(chunk, powers, strict=True))
        return result

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        port_list = _ports(ports)
        if port_list:
            verb = "ENAB" if enabled else "DIS"
            self._write(f":OXC:SWIT:PORT:{verb} {_chanlist(port_list)}")

    def port_states(self, ports: Iterable[int]) -> dict[int, str]:
        result: dict[int, str] = {}
        for chunk in _chunks(_ports(ports), PMON_CHUNK):
            cmd = f":OXC:SWIT:PORT:STAT? {_chanlist(chunk)}"
            reply = self._query(cmd, has_ports=True)
            states = [s.strip().upper() for s in _unwrap(reply).split(",")]
            if len(states) != len(chunk) or not set(states) <= PORT_STATES:
                raise self._protocol(cmd, reply, f"expected {len(chunk)} states, each E, D or F")
            result.update(zip(chunk, states, strict=True))
        return result

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> PolatisScpi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _circuit_command(self, verb: str, pairs: Iterable[tuple[int, int]], check: bool = True) -> None:
        # The switch wants the lower number (ingress) first in each pair.
        ingress: list[int] = []
        egress: list[int] = []
        for a, b in pairs:
            low, high = operator.index(a), operator.index(b)
            if low > high:
                low, high = high, low
            ingress.append(low)
            egress.append(high)
        if ingress:
            self._write(f"{verb} {_chanlist(ingress)},{_chanlist(egress)}", check=check)

    def _query(self, cmd: str, *, has_ports: bool = False) -> str:
        try:
            return self.transport.query(cmd)
        except DeviceTimeout as timeout:
            # SCPI sends no reply to a query it rejects (e.g. a port out of range) and queues the error
            # instead; a bare timeout would then send the user looking at cables. Only for queries that
            # carry ports, so that a dead switch costs one timeout on the argument-free ones.
            if not (has_ports and self.auto_check_errors):
                raise
            try:
                errors = self._drain_errors()
            except DeviceError:
                errors = []  # it answers nothing at all: the timeout is the story
            if not errors:
                raise
            raise self._command_error(cmd, errors) from timeout

    def _write(self, cmd: str, *, check: bool = True) -> None:
        self.transport.write(cmd)
        if check and self.auto_check_errors:
            errors = self._drain_errors()
            if errors:
                raise self._command_error(cmd, errors)

    def _drain_errors(self) -> list[str]:
        """Read the error queue until "0,No error" (bounded), so the next command is judged alone."""
        errors: list[str] = []
        for _ in range(MAX_ERROR_READS):
            reply = self.transport.query(":SYST:ERR?")
            m = _ERROR.match(reply.strip())
            if not m:
                raise self._protocol(":SYST:ERR?", reply, "expected '<code>,\"<text>\"' such as '0,\"No error\"'")
            if int(m.group(1)) == 0:
                return errors
            errors.append(reply.strip())
        errors.append(f"(queue not empty after {MAX_ERROR_READS} reads)")
        return errors

    def _command_error(self, cmd: str, errors: list[str]) -> DeviceCommandError:
        first = errors[0]
        return DeviceCommandError(
            f"the switch refused {cmd!r}: {first}",
            device=self.device,
            address=self.transport.address,
            sent=cmd,
            received="; ".join(errors),
            hint=self._hint_for(int(first.split(",", 1)[0])),
        )

    def _hint_for(self, code: int) -> str:
        if code in (-222, -224, -114):  # data out of range, illegal value, suffix out of range
            return switch_ports_hint(self._size, self.size) or (
                "a port number is outside the switch; :OXC:SWIT:SIZE? gives its ingress/egress counts"
            )
        if code in (-100, -102, -104, -108, -109, -113):
            return "the switch does not accept this command form; check its model and firmware version"
        return "see the switch's SCPI error list; *CLS clears the error queue"

    def _ints(self, cmd: str, reply: str, text: str) -> list[int]:
        items = [t.strip() for t in text.split(",")] if text.strip() else []
        try:
            return [int(t) for t in items]
        except ValueError:
            raise self._protocol(cmd, reply, "expected port numbers in the channel lists") from None

    def _protocol(self, cmd: str, reply: str, expected: str) -> DeviceProtocolError:
        return DeviceProtocolError(
            f"unexpected reply to {cmd!r}: {expected}",
            device=self.device,
            address=self.transport.address,
            sent=cmd,
            received=reply,
            hint="is this a Polatis switch speaking SCPI, and are read/write_termination right for it?",
        )


def _ports(ports: Iterable[int]) -> list[int]:
    # operator.index: a float or a string must fail here, not go out on the wire as "3.0" or "'3'".
    return [operator.index(p) for p in ports]


def _chanlist(ports: Sequence[int]) -> str:
    return "(@" + ",".join(map(str, ports)) + ")"


def _chunks(items: list[int], n: int) -> Iterable[list[int]]:
    return (items[i : i + n] for i in range(0, len(items), n))


def _unwrap(reply: str) -> str:
    """Drop optional surrounding parentheses: '(-3.1,-99.99)' and '-3.1,-99.99' both occur."""
    text = reply.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text
