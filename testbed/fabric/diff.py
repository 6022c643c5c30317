"""The smallest change that makes a switch hold a target set of circuits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Pair = tuple[int, int]


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
