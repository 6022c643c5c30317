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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from testbed.families.interlocks import Policy

Procedure = Callable[..., object]  # (driver, ctx, **kwargs) -> JSON-able value
Problem = tuple[tuple, str]


@dataclass(frozen=True)
class ProcedureSpec:
    function: Procedure
    marks: tuple[str, ...] = ()  # the milestones it may mark (events.jsonl's schema lists them)


@dataclass(frozen=True)
class TwinSupport:
    """How the twin emulates a family's device. `spec(name, device, inventory, seed)` returns the emulator's
    spec as plain data (JSON-able, with "kind"); `refs` names the emulator's spec class and adapter
    ("module:Name") when they are not among the emulators' built-in kinds (emulators/kinds.py).
    """

    spec: Callable[[str, Any, Any, int], dict]
    refs: tuple[str, str] | None = None


@dataclass(frozen=True)
class DeviceFamily:
    kind: str
    model: type
    capability: type
    role: str  # "switch" (holds circuits, fibres land on it), "host" (runs the job's ranks) or "instrument"
    procedures: Mapping[str, ProcedureSpec]
    operations: Mapping[str, str] = field(default_factory=dict)
    policy: Callable[[str, Any], Policy | None] = lambda name, device: None
    check: Callable[[str, Any, Any], list[Problem]] = lambda name, device, inventory: []
    holds_fabric: bool = False
    # Served from a process of its own rather than its node's shared hub (testbed/engine/hub.py): for the few
    # devices whose calls are latency-critical and CPU-heavy (a switch formats and checks hundreds of circuits
    # per change), so that they run in parallel and no other device's threads hold the GIL they need.
    own_process: bool = False
    twin: TwinSupport | None = None
    ground_truth: str | None = None
    description: str = ""

    def operation(self, name: str) -> str | None:
        return self.operations.get(name)
