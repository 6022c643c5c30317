"""The optical circuit switch family (kind `ocs`): the CircuitSwitch capability (with PortControl: ports out
of service and back, for link.down), its procedures, its interlocks (allowed and reserved ports, read-only),
its circuits as lab state, and its twin.
"""

from __future__ import annotations

from drivers.capabilities import CircuitSwitch
from testbed.config.transports import TransportConfig
from testbed.contracts.jsontypes import JsonObject
from testbed.families.base import DeviceFamily, FamilyInventory, Problem, ProcedureSpec, TwinSupport
from testbed.families.drivers import driver_spec
from testbed.families.interlocks import Policy
from testbed.families.ocs import procedures
from testbed.families.ocs.model import OcsDevice, OcsEmulation

CHANGE_MARKS = ("sent", "acked", "lit", "reverted")


def _policy(name: str, dev: OcsDevice) -> Policy:
    allowed = frozenset(dev.allowed_ports) if dev.allowed_ports is not None else None
    # Typed here: the device's transport is a union built from the registry at run time, which mypy cannot read.
    transport: TransportConfig = dev.transport
    return Policy(name, transport.address(), dev.read_only, allowed, frozenset(dev.reserved_ports))


def _check(name: str, dev: OcsDevice, inventory: FamilyInventory) -> list[Problem]:
    problems: list[Problem] = []
    top = 2 * dev.size
    for key in ("allowed_ports", "reserved_ports"):
        bad = next((p for p in getattr(dev, key) or [] if not 1 <= p <= top), None)
        if bad is not None:
            problems.append(
                (
                    ("devices", name, key),
                    f"port {bad} is out of range for a {dev.size}x{dev.size} switch (ports 1..{top})",
                )
            )
    seen: set[int] = set()
    for j, (ingress, egress) in enumerate(dev.emulation.circuits):
        loc = ("devices", name, "emulation", "circuits", j)
        if not (1 <= ingress <= dev.size < egress <= top):
            problems.append(
                (loc, f"({ingress}, {egress}) is not (ingress 1..{dev.size}, egress {dev.size + 1}..{top})")
            )
        elif ingress in seen or egress in seen:
            problems.append((loc, f"({ingress}, {egress}) reuses a port: a port carries one circuit"))
        seen.update((ingress, egress))
    return problems


def _twin_spec(name: str, dev: OcsDevice, inventory: FamilyInventory, seed: int) -> JsonObject:
    e = dev.emulation
    return {
        "kind": "ocs",
        "name": name,
        "size": dev.size,
        "switching_time_ms": e.switching_time_ms,
        "jitter_ms": e.jitter_ms,
        "insertion_loss_db": e.insertion_loss_db,
        # Light enters where each fibre is really cabled (FibreEmulation), which the map may get wrong.
        "input_power_dbm": {f.actual()[0]: f.launch_power_dbm for f in inventory.fibres if f.switch == name},
        "seed": seed * 1000 + list(inventory.devices).index(name),
        "idn": e.idn,
        "circuits": [list(c) for c in e.circuits],
        # The twin serves the interface the device's driver speaks (and SCPI, the switch's own LAN interface).
        "frontends": sorted({"scpi", _frontend(dev.driver)}),
        "user": getattr(dev.transport, "user", "admin"),
    }


def _frontend(driver: str) -> str:
    spec = driver_spec(driver)
    return spec.frontend if spec is not None and spec.frontend else "scpi"


FAMILY = DeviceFamily(
    kind="ocs",
    model=OcsDevice,
    capability=CircuitSwitch,
    role="switch",
    own_process=True,
    procedures={
        "ocs.identify": ProcedureSpec(procedures.identify),
        "ocs.reconfigure": ProcedureSpec(procedures.reconfigure, CHANGE_MARKS),
        "ocs.clear": ProcedureSpec(procedures.clear, ("sent", "acked")),
        "ocs.connections": ProcedureSpec(procedures.connections),
        # Ports out of service and back (link.down): the drivers' PortControl capability.
        "ocs.disable_ports": ProcedureSpec(procedures.disable_ports, ("fault_injected",)),
        "ocs.enable_ports": ProcedureSpec(procedures.enable_ports, ("fault_healed",)),
        "ocs.port_states": ProcedureSpec(procedures.port_states),
    },
    operations={
        "identify": "ocs.identify",
        "reconfigure": "ocs.reconfigure",
        "clear": "ocs.clear",
        "read_fabric": "ocs.connections",
        "disable_ports": "ocs.disable_ports",
        "enable_ports": "ocs.enable_ports",
        "port_states": "ocs.port_states",
    },
    policy=_policy,
    check=_check,
    holds_fabric=True,
    twin=TwinSupport(_twin_spec),
    description="an optical circuit switch: ingress ports 1..N, egress N+1..2N",
)

__all__ = ["FAMILY", "OcsDevice", "OcsEmulation"]
