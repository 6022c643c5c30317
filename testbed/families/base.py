"""What a device family is: everything the framework knows about one kind of device, in one place.

A family gives (docs/architecture.md, "Adding a device family"):
- `kind` and `model`: the inventory's `kind:` and the pydantic model of such a device (a DeviceConfig, or a
  SwitchConfig for a device that holds circuits between ports, so fibres may land on it);
- `capability`: the typing.Protocol its drivers implement (drivers.capabilities);
- `procedures`: what runs inside a device's actor, next to its driver, and the marks each may take;
- `operations`: which procedure does each generic operation the engine asks for (identify, reconfigure,
  clear, calibrate, read_fabric);
- `policy(name, device)`: the interlocks a device's actor enforces on every write;
- `check(name, device, inventory)`: the family's own inventory checks, as located problems;
- `holds_fabric`: its circuits are state the lab's owner expects back: read at the start of a run and at its
  end, replayed by `testbed check` through the driver's audit model, restored by `testbed heal`;
- `own_process`: its devices are served from a process each, not the node's shared hub;
- `twin`: how the emulated twin stands in for it (the emulator's spec as plain data, and where the emulator
  lives), or None when there is no emulator yet;
- `ground_truth`: the twin's control op that returns the device's transfer matrix, if it has one.

A driver (one wire protocol) is registered to a family by name (testbed/families/drivers.py); nothing outside the
driver assumes which protocol a family's device speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from testbed.config.device import DeviceConfig
from testbed.contracts.jsontypes import JsonObject, JsonValue
from testbed.families.interlocks import Policy

if TYPE_CHECKING:
    from testbed.config.cabling import Fibre

Procedure: TypeAlias = Callable[..., JsonValue]  # (driver, ctx, **kwargs) -> JSON-able value
# Where a problem is in the inventory (a key path: "devices", name, key, index...), and what it is.
Location: TypeAlias = tuple[str | int, ...]
Problem: TypeAlias = tuple[Location, str]
# A device of the family's own model (DeviceFamily.model, a subclass of DeviceConfig). Each family's functions take
# their own model, which one field type for every family cannot say (a Callable's parameters are contravariant).
FamilyDevice: TypeAlias = Any


class FamilyInventory(Protocol):
    """What a family's checks and twin spec read of the inventory (testbed.documents.inventory.Inventory is one;
    a Protocol, so that the families stay below the assembled documents in the layers).
    """

    @property
    def devices(self) -> Mapping[str, DeviceConfig]:
        """Every device by name, in the inventory's order."""

    @property
    def fibres(self) -> Sequence[Fibre]:
        """The fibre map: each host port and the switch ports it is cabled to."""


@dataclass(frozen=True)
class ProcedureSpec:
    """One procedure of a family: the function a device's actor runs, and the marks it may take."""

    function: Procedure
    marks: tuple[str, ...] = ()  # the milestones it may mark (events.jsonl's schema lists them)


@dataclass(frozen=True)
class TwinSupport:
    """How the twin emulates a family's device. `spec(name, device, inventory, seed)` returns the emulator's
    spec as plain data (JSON-able, with "kind"); `refs` names the emulator's spec class and adapter
    ("module:Name") when they are not among the emulators' built-in kinds (emulators/kinds.py).
    """

    spec: Callable[[str, FamilyDevice, FamilyInventory, int], JsonObject]
    refs: tuple[str, str] | None = None


@dataclass(frozen=True)
class DeviceFamily:
    """Everything the framework knows about one kind of device (the module's docstring says what each field is)."""

    kind: str
    model: type[DeviceConfig]
    capability: type
    role: str  # "switch" (holds circuits, fibres land on it), "host" (runs the job's ranks) or "instrument"
    procedures: Mapping[str, ProcedureSpec]
    operations: Mapping[str, str] = field(default_factory=dict)
    policy: Callable[[str, FamilyDevice], Policy | None] = lambda name, device: None
    check: Callable[[str, FamilyDevice, FamilyInventory], list[Problem]] = lambda name, device, inventory: []
    holds_fabric: bool = False
    # Served from a process of its own rather than its node's shared hub (testbed/engine/hub.py): for the few
    # devices whose calls are latency-critical and CPU-heavy (a switch formats and checks hundreds of circuits
    # per change), so that they run in parallel and no other device's threads hold the GIL they need.
    own_process: bool = False
    twin: TwinSupport | None = None
    ground_truth: str | None = None
    description: str = ""

    def operation(self, name: str) -> str | None:
        """The procedure that does the generic operation `name` (identify, reconfigure...); None if none does."""
        return self.operations.get(name)
