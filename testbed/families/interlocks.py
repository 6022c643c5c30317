"""The inventory's interlocks, enforced again next to the driver: the planner refuses a playbook that
would touch a reserved port, and this guard refuses the write itself, whatever asked for it (a bug, a
procedure added later, a hand-written script using the actor).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from drivers.capabilities import CircuitSwitch
from drivers.errors import InterlockError

# Methods that change a switch. Everything else (identify, connections, port_power...) only reads.
SWITCH_WRITES = {"connect", "disconnect", "disconnect_all", "set_port_enabled"}


@dataclass(frozen=True)
class Policy:
    """The interlocks of one device, from the inventory: read-only, the ports a run may touch, those it must not."""

    device: str
    address: str
    read_only: bool = False
    allowed_ports: frozenset[int] | None = None  # None: every port
    reserved_ports: frozenset[int] = frozenset()

    def refuse(self, what: str, ports: Iterable[int] | None) -> None:
        """Raise InterlockError if the policy forbids writing `what` on `ports` (None: no port named)."""
        if self.read_only:
            raise InterlockError(
                f"refused {what}: the inventory marks {self.device} read-only",
                device=self.device,
                address=self.address,
                hint="remove read_only from the device in the inventory if the run may write to it",
            )
        if ports is None:
            return
        bad = sorted(
            p
            for p in set(ports)
            if p in self.reserved_ports or (self.allowed_ports is not None and p not in self.allowed_ports)
        )
        if bad:
            raise InterlockError(
                f"refused {what}: port(s) {bad} are reserved or not allowed by the inventory",
                device=self.device,
                address=self.address,
                hint="change allowed_ports / reserved_ports in the inventory, or the playbook",
            )


class GuardedSwitch:
    """A CircuitSwitch that checks every write against the policy before the driver sends anything."""

    def __init__(self, switch: CircuitSwitch, policy: Policy) -> None:
        self._switch = switch
        self._policy = policy

    @property
    def wrapped(self) -> CircuitSwitch:
        """The driver it guards (to name it in an error; its writes go through the guard)."""
        return self._switch

    # Any: the attribute is whatever the wrapped driver has under that name (a method, a plain value).
    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._switch, name)
        if name not in SWITCH_WRITES:
            return attr

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if name == "disconnect_all":
                self._policy.refuse(name, None)
                if self._policy.reserved_ports or self._policy.allowed_ports is not None:
                    raise InterlockError(
                        "refused disconnect_all: it would also remove circuits on ports the inventory reserves "
                        "or does not allow",
                        device=self._policy.device,
                        address=self._policy.address,
                        hint="disconnect the playbook's own circuits instead (fabric.clear does)",
                    )
            else:
                first = args[0] if args else kwargs.get("pairs", kwargs.get("ports", []))
                items = list(first)
                ports = [p for item in items for p in (item if isinstance(item, tuple | list) else (item,))]
                self._policy.refuse(f"{name} {items}", ports)
            return attr(*args, **kwargs)

        return guarded
