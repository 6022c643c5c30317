"""The lab inventory: devices, how to reach them, how they are cabled, and what may be touched.

Validated once, at load (testbed.documents.load); everything after that works on these frozen models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field

from testbed.config.cabling import Fibre, Trunk
from testbed.config.common import Name, Strict
from testbed.config.device import DeviceConfig, SwitchConfig
from testbed.families import FAMILIES, family_of

# --- devices: one model per registered family ---------------------------------------------------


if TYPE_CHECKING:
    Device = DeviceConfig  # every family's model is one; the union below is built at run time, past mypy's sight
else:
    # Built when this module is imported: a family another package registers (entry point) is in it too.
    Device = Annotated[Union[tuple(f.model for f in FAMILIES)], Field(discriminator="kind")]  # noqa: UP007


class Inventory(Strict):
    name: Name
    description: str = ""
    emulated_only: bool = Field(False, description="addresses are placeholders: refuse runs without --emulate")
    devices: dict[Name, Device]
    fibres: list[Fibre] = Field(default_factory=list)
    trunks: list[Trunk] = Field(
        default_factory=list,
        description="switch-to-switch fibres, one direction each: {from, egress, to, ingress, loss_db}",
    )
    spares: list[Name] = Field(default_factory=list)
    controller_address: str | None = Field(
        None,
        description="this control host's address on the lab network, where the GPU hosts reach the services a run "
        "starts on it (the job's fabric service); default: found from the route to each host",
    )

    def switches(self) -> dict[str, SwitchConfig]:
        """Devices that hold circuits between ports (fibres and trunks land on them)."""
        return {n: d for n, d in self.devices.items() if isinstance(d, SwitchConfig)}

    def hosts(self) -> dict[str, DeviceConfig]:
        """Devices that run the job's ranks (their family's role is "host")."""
        return {n: d for n, d in self.devices.items() if family_of(d).role == "host"}

    def fibre_of(self, host: str, port: str) -> Fibre | None:
        return next((f for f in self.fibres if f.host == host and f.port == port), None)
