"""What every switch-like family (an OCS, a photonic chip used as a circuit switch) does alike: the smallest change
that makes a switch hold a target set of circuits (`circuit_diff`), and a change made commit-confirm (`reconfigure`).

A family describes its own device to the change as a `Circuits` (how to read it, what to send, how to undo it),
and its `reconfigure` procedure is this module's, so the marks, the checks and the revert are the same for every
switch, and `testbed check` and the failover's milestones read them the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict, TypeVar, cast

from testbed.families.context import ProcedureContext
from testbed.families.verify import VerificationError, check_holds, revert_unverified, wait_for_light

Pair = tuple[int, int]
Driver = TypeVar("Driver")


def circuit_diff(
    current: Mapping[int, int], target: Iterable[Pair], managed: Iterable[int]
) -> tuple[list[Pair], list[Pair]]:
    """(remove, add) taking `current` (ingress -> egress) to hold every target circuit.

    Only circuits that touch a `managed` port may be removed (the rest of the switch belongs to someone
    else); a circuit already in place is neither removed nor re-added, so light on it never blinks.
    A circuit is removed when it is not wanted, or when it holds an ingress or egress the target needs.
    """
    want = dict(target)
    owned = set(managed)
    wanted_egress = set(want.values())
    remove = []
    for ingress, egress in sorted(current.items()):
        if want.get(ingress) == egress:
            continue
        needed = ingress in want or egress in wanted_egress
        if needed or ingress in owned or egress in owned:
            remove.append((ingress, egress))
    add = [(i, e) for i, e in sorted(want.items()) if current.get(i) != e]
    return remove, add


@dataclass(frozen=True)
class Change:
    """One change to a switch: the circuits it must hold afterwards (`holds`: checked on the read-back), and what
    is removed and added (counted in the procedure's result).
    """

    holds: Mapping[int, int]
    removed: list[Pair]
    added: list[Pair]


@dataclass(frozen=True)
class Wording:
    """What a failed check says: the device checked, what was sent to check it, and what the user may do."""

    holds_what: str
    holds_hint: str
    light_what: str
    light_hint: str
    holds_sent: str | None = None
    light_sent: str | None = None


class Circuits(Protocol):
    """A switch-like device as the commit-confirm change drives it."""

    cache_key: str  # where the procedure context keeps the circuits last read (forgotten on an error)
    wording: Wording

    def read(self) -> dict[int, int]:
        """The circuits the device holds (ingress -> egress)."""

    def change(self, current: Mapping[int, int], target: Mapping[int, int], managed: Sequence[int]) -> Change:
        """The change from `current` that makes the device hold `target`, touching `managed` ports only."""

    def apply(self, change: Change) -> None:
        """Send the change and return once the device has acknowledged it (settled)."""

    def restore(self, before: Mapping[int, int], managed: Sequence[int]) -> None:
        """Put the device back as it held `before`."""

    def power(self, ports: Sequence[int]) -> dict[int, float]:
        """The optical power (dBm) at these output ports."""


class ChangeResult(TypedDict):
    """What a switch's reconfigure returns: the circuits added and removed, the weakest new output's power."""

    added: int
    removed: int
    min_power_dbm: float | None  # None: light was not verified


class Removed(TypedDict):
    """What a switch's clear returns: how many of the playbook's circuits it removed."""

    removed: int


def reconfigure_procedure(circuits_of: Callable[[Driver], Circuits], doc: str) -> Callable[..., ChangeResult]:
    """A family's `reconfigure` procedure: `(driver, ctx, *, circuits, managed, verify_light, min_power_dbm,
    timeout_s)`, the driver seen through `circuits_of(driver)` (a Circuits), its cached circuits forgotten when
    it fails (testbed.families.context.forgets_on_error).
    """

    def procedure(
        driver: Driver,
        ctx: ProcedureContext,
        *,
        circuits: list[Pair],
        managed: list[int],
        verify_light: bool = True,
        min_power_dbm: float = -20.0,
        timeout_s: float = 5.0,
    ) -> ChangeResult:
        device = circuits_of(driver)
        try:
            return reconfigure(
                device,
                ctx,
                circuits=circuits,
                managed=managed,
                verify_light=verify_light,
                min_power_dbm=min_power_dbm,
                timeout_s=timeout_s,
            )
        except BaseException:
            ctx.cache.pop(device.cache_key, None)  # the device may hold anything now: read it afresh next time
            raise

    procedure.__name__ = procedure.__qualname__ = "reconfigure"
    procedure.__doc__ = doc
    return procedure


def reconfigure(
    device: Circuits,
    ctx: ProcedureContext,
    *,
    circuits: list[Pair],
    managed: list[int],
    verify_light: bool,
    min_power_dbm: float,
    timeout_s: float,
) -> ChangeResult:
    """Make the device hold `circuits`, changing circuits on `managed` ports only, commit-confirm (as NAPALM's).

    Marks: sent (first command written), acked (the device acknowledged the change: settled), lit (every new
    output reads light above `min_power_dbm`). A change whose read-back or light is not verified within
    `timeout_s` is reverted (mark reverted) and the error says so, so that a failed operation in the history
    really left the device as it was.
    """
    target = dict(circuits)
    current = cast(Mapping[int, int] | None, ctx.cache.get(device.cache_key))  # what the last read stored
    if current is None:
        current = device.read()
    change = device.change(current, target, managed)
    ctx.mark("sent")
    device.apply(change)
    ctx.mark("acked")
    now = device.read()
    ctx.cache[device.cache_key] = now
    words = device.wording
    powers: dict[int, float] = {}
    try:
        check_holds(change.holds, now, ctx, what=words.holds_what, sent=words.holds_sent, hint=words.holds_hint)
        if verify_light and target:
            powers = wait_for_light(
                device.power,
                ctx,
                sorted(target.values()),
                min_power_dbm,
                timeout_s,
                what=words.light_what,
                sent=words.light_sent,
                hint=words.light_hint,
            )
            ctx.mark("lit")
    except VerificationError as exc:
        revert_unverified(exc, ctx, _restoring(device, current, managed))
    return {
        "added": len(change.added),
        "removed": len(change.removed),
        "min_power_dbm": min(powers.values()) if powers else None,
    }


def _restoring(device: Circuits, before: Mapping[int, int], managed: Sequence[int]) -> Callable[[], None]:
    """Undoing the change: the device put back as it held `before`."""
    return lambda: device.restore(before, managed)
