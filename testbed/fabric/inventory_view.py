"""What the fabric logic reads of an inventory: its devices, fibres, trunks, switches and spares.

A Protocol rather than the inventory's model (testbed.documents.inventory.Inventory is one), so that the fabric
logic stays below the assembled documents in the layers (docs/architecture.md): the steps that plan with it are
what the playbook's union of steps is built from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from testbed.config.cabling import Fibre, Trunk
from testbed.config.device import DeviceConfig, SwitchConfig


class InventoryView(Protocol):
    @property
    def devices(self) -> Mapping[str, DeviceConfig]: ...  # read only: an inventory's dict is one

    fibres: list[Fibre]
    trunks: list[Trunk]
    spares: list[str]

    def switches(self) -> dict[str, SwitchConfig]: ...

    def fibre_of(self, host: str, port: str) -> Fibre | None: ...
