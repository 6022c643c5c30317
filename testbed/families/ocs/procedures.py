"""Optical circuit switch procedures over the CircuitSwitch capability."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TypedDict

from drivers.capabilities import CircuitSwitch, PortControl
from drivers.errors import DeviceCommandError
from testbed.families import switching
from testbed.families.context import ProcedureContext, forgets_on_error
from testbed.families.switching import Change, Removed, Wording, circuit_diff
from testbed.families.verify import VerificationError


class SwitchIdentity(TypedDict):
    """What ocs.identify returns: the switch's identity, its port counts and the circuits it holds."""

    vendor: str
    model: str
    serial: str
    firmware: str
    size: list[int]  # [ingress ports, egress ports]
    circuits: dict[int, int]


class PortsDisabled(TypedDict):
    """What ocs.disable_ports returns: the ports, their states read back, and when they went dark."""

    ports: list[int]
    states: dict[int, str]
    fault_injected_ns: int


class PortsEnabled(TypedDict):
    """What ocs.enable_ports returns: the ports and their states read back."""

    ports: list[int]
    states: dict[int, str]


def identify(switch: CircuitSwitch, ctx: ProcedureContext, *, expected_size: int | None = None) -> SwitchIdentity:
    """The switch's identity and the circuits it holds (cached); VerificationError if its size is not as inventoried."""
    ident = switch.identify()
    n_in, n_out = switch.size()
    if expected_size is not None and (n_in, n_out) != (expected_size, expected_size):
        raise VerificationError(
            f"the switch reports {n_in}x{n_out} ports but the inventory says {expected_size}x{expected_size}",
            device=ctx.device,
            address=ctx.address,
            sent="size() (the switch's port count)",
            received=f"{n_in},{n_out}",
            hint="correct `size` in the inventory, or check that the address points at the right switch",
        )
    circuits = ctx.cache["connections"] = switch.connections()
    return {
        "vendor": ident.vendor,
        "model": ident.model,
        "serial": ident.serial,
        "firmware": ident.firmware,
        "size": [n_in, n_out],
        "circuits": circuits,
    }


def connections(switch: CircuitSwitch, ctx: ProcedureContext) -> dict[int, int]:
    """The circuits the switch holds (ingress -> egress), kept in the cache for the next change."""
    circuits = ctx.cache["connections"] = switch.connections()
    return circuits


class _SwitchCircuits:
    """An OCS as the commit-confirm change drives it (testbed.families.switching)."""

    cache_key = "connections"
    wording = Wording(
        holds_what="after the change the switch",
        holds_sent="connections() (the circuits it holds)",
        holds_hint="another client may be changing the switch, or the ports are failed",
        light_what="egress port(s)",
        light_sent="port_power() (the egress ports' power)",
        light_hint="check that the hosts cabled to these circuits transmit (fibre map), that the ports are not "
        "failed, or lower min_power_dbm in the playbook",
    )

    def __init__(self, switch: CircuitSwitch) -> None:
        self.switch = switch

    def read(self) -> dict[int, int]:
        """The circuits the switch holds."""
        return self.switch.connections()

    def change(self, current: Mapping[int, int], target: Mapping[int, int], managed: Sequence[int]) -> Change:
        """The smallest change: circuits on `managed` ports removed only where they are in the way."""
        remove, add = circuit_diff(current, sorted(target.items()), managed)
        return Change(holds=target, removed=remove, added=add)

    def apply(self, change: Change) -> None:
        """Disconnect, connect, check the error queue, wait for the mirrors to settle."""
        # Commands go back to back, and the error queue is read while the mirrors move: the switch executes
        # commands in order, so the errors of both are queued by then, and the check takes no time of its own.
        # A refused change is reported before waiting for a move that may never come.
        if change.removed:
            self.switch.disconnect(change.removed, check=False)
        if change.added:
            self.switch.connect(change.added, check=False)
        self.switch.check_errors("the circuit change")
        self.switch.wait_settled()

    def restore(self, before: Mapping[int, int], managed: Sequence[int]) -> None:
        """Put back the circuits of `before` on `managed` ports."""
        remove, add = circuit_diff(self.switch.connections(), sorted(before.items()), managed)
        if remove:
            self.switch.disconnect(remove, check=False)
        if add:
            self.switch.connect(add, check=False)
        self.switch.wait_settled()
        self.switch.check_errors("reverting the unverified change")

    def power(self, ports: Sequence[int]) -> dict[int, float]:
        """The egress ports' power (dBm)."""
        return self.switch.port_power(ports)


reconfigure = switching.reconfigure_procedure(
    _SwitchCircuits,
    """Make the switch hold `circuits`, removing other circuits on `managed` ports only, commit-confirm.

Marks: sent (first command written), acked (`*OPC?` answered: the switch has settled), lit (every new egress
port reads light above `min_power_dbm`); reverted (the change was not verified and was undone:
testbed.families.switching.reconfigure).""",
)


@forgets_on_error("connections")
def clear(switch: CircuitSwitch, ctx: ProcedureContext, *, managed: list[int]) -> Removed:
    """Remove every circuit on `managed` ports; leave the rest of the switch alone."""
    current = switch.connections()
    remove, _ = circuit_diff(current, [], managed)
    ctx.mark("sent")
    if remove:
        switch.disconnect(remove)
    switch.wait_settled()
    ctx.mark("acked")
    ctx.cache["connections"] = {i: e for i, e in current.items() if (i, e) not in remove}
    return {"removed": len(remove)}


# --- ports out of service and back (the link.down fault kind) ------------------------------------------


def _port_control(switch: CircuitSwitch, ctx: ProcedureContext) -> PortControl:
    """The switch's PortControl capability, or a refusal naming its driver before anything is sent."""
    missing = [m for m in ("set_port_enabled", "port_states") if not callable(getattr(switch, m, None))]
    if missing:
        driver = type(getattr(switch, "wrapped", switch)).__name__
        raise DeviceCommandError(
            f"its driver ({driver}) cannot take ports out of service: it has no {' / '.join(missing)} "
            "(drivers.capabilities.PortControl)",
            device=ctx.device,
            address=ctx.address,
            hint="link.down needs a driver that can disable and enable ports; use another fault kind here",
        )
    return switch


def _states(switch: PortControl, ctx: ProcedureContext, ports: list[int], want: set[str], what: str) -> dict[int, str]:
    """Read the ports' states back; VerificationError unless each is one of `want`."""
    states = {int(p): s for p, s in switch.port_states(ports).items()}
    wrong = {p: states.get(p) for p in ports if states.get(p) not in want}
    if wrong:
        raise VerificationError(
            f"after {what} port(s) {sorted(wrong)} read {', '.join(f'{p}: {s}' for p, s in sorted(wrong.items()))}"
            f" (expected {' or '.join(sorted(want))})",
            device=ctx.device,
            address=ctx.address,
            sent="port_states() (E enabled, D disabled, F failed)",
            hint="another client may be changing the switch's ports, or a port failed",
        )
    return states


def disable_ports(switch: CircuitSwitch, ctx: ProcedureContext, *, ports: list[int]) -> PortsDisabled:
    """Take `ports` out of service (they carry no light; their circuits stay), then read their states back:
    each must be disabled (or failed, dark too). Mark: fault_injected at the midpoint of the disable command
    (the switch applies it somewhere inside that call; the midpoint is off by at most half of it).
    """
    control = _port_control(switch, ctx)
    ports = sorted({int(p) for p in ports})
    t0 = time.monotonic_ns()
    control.set_port_enabled(ports, False)
    ns = ctx.mark_at("fault_injected", (t0 + time.monotonic_ns()) // 2)
    states = _states(control, ctx, ports, {"D", "F"}, "disabling")
    return {"ports": ports, "states": states, "fault_injected_ns": ns}


def enable_ports(switch: CircuitSwitch, ctx: ProcedureContext, *, ports: list[int]) -> PortsEnabled:
    """Put `ports` back in service, then read their states back: each must be enabled (a failed port is not
    repaired by enabling it, and is reported). Mark: fault_healed once the switch has taken the command.
    """
    control = _port_control(switch, ctx)
    ports = sorted({int(p) for p in ports})
    control.set_port_enabled(ports, True)
    ctx.mark("fault_healed")
    states = _states(control, ctx, ports, {"E"}, "enabling")
    return {"ports": ports, "states": states}


def port_states(switch: CircuitSwitch, ctx: ProcedureContext, *, ports: list[int]) -> dict[int, str]:
    """Each port's state: E (enabled), D (disabled) or F (failed)."""
    return {int(p): s for p, s in _port_control(switch, ctx).port_states(sorted({int(p) for p in ports})).items()}
