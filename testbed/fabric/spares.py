"""Which spare replaces a failed host: same rack (shared-risk group) first, then the least used, and
among equals a choice that is fixed by the seed, so a run can be repeated.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from testbed.fabric.inventory_view import InventoryView


class NoSpareError(RuntimeError):
    pass


def choose_spare(
    failed: str,
    inv: InventoryView,
    *,
    in_use: set[str],
    used_count: Mapping[str, int],
    seed: int,
    spares: list[str] | None = None,
) -> str:
    """`spares` overrides the inventory's list (a job may keep its own, e.g. the hosts cabled to a chip)."""
    pool = inv.spares if spares is None else spares
    free = [s for s in pool if s not in in_use and s != failed]
    if not free:
        raise NoSpareError(f"no free spare for {failed}: spares {pool}, all in use")
    failed_dev = inv.devices[failed]
    rack = getattr(failed_dev, "rack", None)  # a host's shared-risk group, if the inventory gives one

    def key(spare: str) -> tuple[int, int]:
        dev = inv.devices[spare]
        same_rack = rack is not None and getattr(dev, "rack", None) == rack
        return (0 if same_rack else 1, used_count.get(spare, 0))

    best = min(key(s) for s in free)
    tied = sorted(s for s in free if key(s) == best)
    return random.Random(f"{seed}:{failed}:{','.join(tied)}").choice(tied)
