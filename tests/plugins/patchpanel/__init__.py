"""A third-party device family for testbed, as another lab's package would ship it: a robotic fibre patch panel
(kind `patch_panel`), its driver `panel-tcp`, its emulator and its audit model. It is plugged in by two entry
points only (patchpanel_family-0.1.dist-info/entry_points.txt); testbed's own code is not edited for it.

It reuses the OCS family's procedures: a panel is a circuit switch (the CircuitSwitch capability), only slower
and with another protocol.
"""

from __future__ import annotations

from typing import Literal

from drivers.capabilities import CircuitSwitch
from drivers.transports import open_transport
from testbed.config.device import SwitchConfig
from testbed.families.base import DeviceFamily, ProcedureSpec, TwinSupport
from testbed.families.drivers import DriverSpec
from testbed.families.ocs import procedures


class PanelDevice(SwitchConfig):
    kind: Literal["patch_panel"]
    move_ms: float = 5.0


def _twin_spec(name: str, dev: PanelDevice, inventory, seed: int) -> dict:
    lit = {f.ingress: f.launch_power_dbm for f in inventory.fibres if f.switch == name}
    return {"kind": "patch_panel", "name": name, "size": dev.size, "move_ms": dev.move_ms, "lit": lit}


FAMILY = DeviceFamily(
    kind="patch_panel",
    model=PanelDevice,
    capability=CircuitSwitch,
    role="switch",
    procedures={
        "panel.identify": ProcedureSpec(procedures.identify),
        "panel.reconfigure": ProcedureSpec(procedures.reconfigure, ("sent", "acked", "lit", "reverted")),
        "panel.clear": ProcedureSpec(procedures.clear, ("sent", "acked")),
        "panel.connections": ProcedureSpec(procedures.connections),
    },
    operations={
        "identify": "panel.identify",
        "reconfigure": "panel.reconfigure",
        "clear": "panel.clear",
        "read_fabric": "panel.connections",
    },
    holds_fabric=True,
    twin=TwinSupport(_twin_spec, refs=("patchpanel.emulator:PanelSpec", "patchpanel.emulator:PanelAdapter")),
    description="a robotic fibre patch panel",
)


def _make(device: str, settings, audit):
    from patchpanel.driver import PanelDriver

    return PanelDriver(open_transport(settings, device, audit), device)


def _audit(size: int):
    from patchpanel.audit import PanelAuditModel

    return PanelAuditModel(size)


DRIVER = DriverSpec("panel-tcp", "patch_panel", ("visa", "serial"), _make, _audit)
