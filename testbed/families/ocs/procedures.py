"""Optical circuit switch procedures over the CircuitSwitch capability."""

from __future__ import annotations

import time

from drivers.errors import DeviceCommandError
from testbed.capabilities import CircuitSwitch, PortControl
from testbed.fabric.diff import circuit_diff
from testbed.procedures.context import ProcedureContext, forgets_on_error
from testbed.procedures.errors import VerificationError
from testbed.procedures.verify import check_holds, revert_unverified, wait_for_light


def identify(switch: CircuitSwitch, ctx: ProcedureContext, *, expected_size: int | None = None) -> dict:
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
    ctx.cache["connections"] = switch.connections()
    return {
        "vendor": ident.vendor,
        "model": ident.model,
        "serial": ident.serial,
        "firmware": ident.firmware,
        "size": [n_in, n_out],
        "circuits": ctx.cache["connections"],
    }


def connections(switch: CircuitSwitch, ctx: ProcedureContext) -> dict[int, int]:
    ctx.cache["connections"] = switch.connections()
    return ctx.cache["connections"]


@forgets_on_error("connections")
def reconfigure(
    switch: CircuitSwitch,
    ctx: ProcedureContext,
    *,
    circuits: list[tuple[int, int]],
    managed: list[int],
    verify_light: bool = True,
    min_power_dbm: float = -20.0,
    timeout_s: float = 5.0,
) -> dict:
    """Make the switch hold `circuits`, removing other circuits on `managed` ports only.

    Marks: sent (first command written), acked (`*OPC?` answered: the switch has settled), lit (every
    new egress port reads light above `min_power_dbm`).

    Commit-confirm (as NAPALM's): a change whose read-back or light is not verified within `timeout_s` is
    reverted (the removed circuits back, the added ones gone, mark `reverted`), and the error says so, so
    the failed operation in the history really left the switch as it was.
    """
    target = dict(circuits)
    current = ctx.cache.get("connections")
    if current is None:
        current = switch.connections()
    remove, add = circuit_diff(current, circuits, managed)

    # Commands go back to back, and the error queue is read while the mirrors move: the switch executes
    # commands in order, so the errors of both are queued by then, and the check costs no time of its
    # own (on eight switches driven by one twin on two cores it was a tenth of the rail change). A
    # refused change is reported before waiting for a move that may never come.
    ctx.mark("sent")
    if remove:
        switch.disconnect(remove, check=False)
    if add:
        switch.connect(add, check=False)
    switch.check_errors("the circuit change")
    switch.wait_settled()
    ctx.mark("acked")

    now = switch.connections()
    ctx.cache["connections"] = now
    powers: dict[int, float] = {}
    try:
        check_holds(
            target,
            now,
            ctx,
            what="after the change the switch",
            sent="connections() (the circuits it holds)",
            hint="another client may be changing the switch, or the ports are failed",
        )
        if verify_light and target:
            powers = wait_for_light(
                switch.port_power,
                ctx,
                sorted(target.values()),
                min_power_dbm,
                timeout_s,
                what="egress port(s)",
                sent="port_power() (the egress ports' power)",
                hint="check that the hosts cabled to these circuits transmit (fibre map), that the "
                "ports are not failed, or lower min_power_dbm in the playbook",
            )
            ctx.mark("lit")
    except VerificationError as exc:
        revert_unverified(exc, ctx, lambda: _restore(switch, current, managed))
    return {"added": len(add), "removed": len(remove), "min_power_dbm": min(powers.values()) if powers else None}


def _restore(switch: CircuitSwitch, before: dict[int, int], managed: list[int]) -> None:
    """Put the managed ports back as they were before the change."""
    remove, add = circuit_diff(switch.connections(), sorted(before.items()), managed)
    if remove:
        switch.disconnect(remove, check=False)
    if add:
        switch.connect(add, check=False)
    switch.wait_settled()
    switch.check_errors("reverting the unverified change")


@forgets_on_error("connections")
def clear(switch: CircuitSwitch, ctx: ProcedureContext, *, managed: list[int]) -> dict:
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


def _port_control(switch, ctx: ProcedureContext) -> PortControl:
    """The switch's PortControl capability, or a refusal naming its driver before anything is sent."""
    missing = [m for m in ("set_port_enabled", "port_states") if not callable(getattr(switch, m, None))]
    if missing:
        driver = type(getattr(switch, "wrapped", switch)).__name__
        raise DeviceCommandError(
            f"its driver ({driver}) cannot take ports out of service: it has no {' / '.join(missing)} "
            "(testbed.capabilities.PortControl)",
            device=ctx.device,
            address=ctx.address,
            hint="link.down needs a driver that can disable and enable ports; use another fault kind here",
        )
    return switch


def _states(switch: PortControl, ctx: ProcedureContext, ports: list[int], want: set[str], what: str) -> dict:
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


def disable_ports(switch, ctx: ProcedureContext, *, ports: list[int]) -> dict:
    """Take `ports` out of service (they carry no light; their circuits stay), then read their states back:
    each must be disabled (or failed, dark too). Mark: fault_injected at the midpoint of the disable command
    (the switch applies it somewhere inside that call; the midpoint is off by at most half of it)."""
    control = _port_control(switch, ctx)
    ports = sorted({int(p) for p in ports})
    t0 = time.monotonic_ns()
    control.set_port_enabled(ports, False)
    ns = ctx.mark_at("fault_injected", (t0 + time.monotonic_ns()) // 2)
    states = _states(control, ctx, ports, {"D", "F"}, "disabling")
    return {"ports": ports, "states": states, "fault_injected_ns": ns}


def enable_ports(switch, ctx: ProcedureContext, *, ports: list[int]) -> dict:
    """Put `ports` back in service, then read their states back: each must be enabled (a failed port is not
    repaired by enabling it, and is reported). Mark: fault_healed once the switch has taken the command."""
    control = _port_control(switch, ctx)
    ports = sorted({int(p) for p in ports})
    control.set_port_enabled(ports, True)
    ctx.mark("fault_healed")
    states = _states(control, ctx, ports, {"E"}, "enabling")
    return {"ports": ports, "states": states}


def port_states(switch, ctx: ProcedureContext, *, ports: list[int]) -> dict[int, str]:
    """Each port's state: E (enabled), D (disabled) or F (failed)."""
    return {int(p): s for p, s in _port_control(switch, ctx).port_states(sorted({int(p) for p in ports})).items()}
