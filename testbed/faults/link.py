"""link.down: a link's switch ports taken out of service, then put back (the fibre cut a lab can make without
touching a fibre).

A playbook names the link by the host port whose fibre it is (`link: gpu01:p0`: the switch ingress that host
port transmits into and the egress it receives from, from the inventory's fibre map, so both directions go
dark), or the switch's ports themselves (`device: ocs1, ports: [5, 37]`). The ports are disabled through the
switch family's own procedures (its drivers' PortControl capability: Polatis SCPI `PORT:DIS`, TL1 shutters,
Calient `ED-PORT`, NETCONF `port-set-state`), on a lab as in the twin, whose emulated switch implements the
same commands: a disabled port reads dark on its power monitor and the twin's data plane stops carrying
bytes across any circuit through it. The circuits stay; enabling the ports brings the light back.

The moment of injection is the midpoint of the disable command, marked by the switch's actor
(`fault_injected`, recorded with the procedure's result); in the twin its ground truth logs when the switch
really applied it. `testbed heal` enables the ports the dead run's fault.inject recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.faults.base import DeadFault, FaultEnv, FaultFailed, HealLab, Injected

# The generic operations a switch family names for this kind (DeviceFamily.operations).
DISABLE, ENABLE = "disable_ports", "enable_ports"


@dataclass(frozen=True)
class PortTarget:
    """The ports a link.down takes out of service: the switch, its ports, the host port whose fibre they are
    (None when the playbook named the ports), and the switch family's procedures that disable and enable.
    """

    device: str
    ports: tuple[int, ...]
    link: str | None = None
    disable: str = "ocs.disable_ports"
    enable: str = "ocs.enable_ports"

    @property
    def name(self) -> str:
        """The fault's name in the run's events (`kind@target`), which fault.heal closes."""
        return self.link or f"{self.device}:{','.join(map(str, self.ports))}"


def link_ports(inventory: Any, link: str) -> tuple[str, tuple[int, int]]:
    """(switch, (ingress, egress)) of a host port `host:port`, from the inventory's fibre map; LookupError
    saying why not.
    """
    host, sep, port = link.partition(":")
    fibre = inventory.fibre_of(host, port) if sep else None
    if fibre is None:
        raise LookupError(f"{link} has no fibre in the inventory's fibre map")
    return fibre.switch, (fibre.ingress, fibre.egress)


def port_problems(
    inventory: Any, device: str, ports: list[int], operation: Callable[[Any, str], str | None]
) -> list[str]:
    """What makes `ports` of `device` no target for link.down, as messages: no such device, one whose family
    cannot take ports out of service (`operation(device_config, name)`: the family's procedure for it), a
    port the switch does not have.
    """
    dev = inventory.devices.get(device)
    if dev is None:
        return [f"no device {device!r} in the inventory"]
    size = getattr(dev, "size", None)
    if size is None or operation(dev, DISABLE) is None or operation(dev, ENABLE) is None:
        return [f"{device} is a {dev.kind}, whose family cannot take ports out of service (no {DISABLE} operation)"]
    bad = [p for p in ports if not 1 <= p <= 2 * size]
    if bad:
        return [f"{device} has no port {bad[0]} (a {size}x{size} switch has ports 1..{2 * size})"]
    if not ports:
        return ["give at least one port"]
    return []


def interlock_problems(inventory: Any, device: str, ports: list[int]) -> list[str]:
    """The inventory's interlocks on disabling `ports` (a write): a read-only switch, reserved ports."""
    problems: list[str] = inventory.devices[device].write_problems(
        device, ports, "link.down would disable its ports", "link.down", "disable"
    )
    return problems


@dataclass(frozen=True)
class LinkDown:
    """A link's switch ports disabled (no light, the circuits kept), then enabled again."""

    name: str = "link.down"
    target: str = "ports"
    lab_support: str | None = None  # the switch's own commands, on a lab as in the twin
    marks_failed_on_lab: bool = False

    def describe(self, params: dict[str, Any]) -> str:
        """The switch and its ports, as `testbed plan` shows them after the kind."""
        ports = list(params.get("ports", ()))
        return f": {params.get('device')} port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))} disabled"

    def inject(self, env: FaultEnv, target: PortTarget) -> Injected:
        """Disable the ports (the switch family's procedure), its midpoint marked by the switch's actor."""
        result = env.call(target.device, target.disable, {"ports": list(target.ports)})
        return Injected(result.marks["fault_injected"][0], marked_by_device=True)

    def heal(self, env: FaultEnv, target: PortTarget) -> None:
        """Enable the ports again: the circuits, kept, carry light again."""
        env.call(target.device, target.enable, {"ports": list(target.ports)})

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Enable the ports the dead run's fault.inject recorded, through the switch family's procedure."""
        device = fault.data.get("device") or fault.device
        ports = [int(p) for p in fault.data.get("ports") or ()]
        if not device or not ports:
            raise FaultFailed(f"{fault.name}: the history does not say which ports of which switch were disabled")
        operation = getattr(lab, "operation", None)
        enable = (operation(device, ENABLE) if operation is not None else None) or PortTarget.enable
        done = lab.call(device, enable, {"ports": ports}, "heal: enable the ports link.down disabled")
        states = ", ".join(f"{p}: {s}" for p, s in sorted((int(p), s) for p, s in done["states"].items()))
        return f"enabled port(s) {ports} of {device} (now {states})"


LINK_FAULTS = (LinkDown(),)
