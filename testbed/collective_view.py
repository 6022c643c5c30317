"""The collective playbook's view of a run (playbooks/collective-reconfig.yaml, docs/collective.md): per message
size, each case's all-reduce time (`<case>.time`, p50) and, for each case against the ring, the crossover: the
largest size at which the case is faster than the ring (reconfiguring pays below it), or none.

Shown by `testbed report` (and at the end of `testbed run`) when the run swept `message_bytes` and measured the
ring and at least one other case; testbed/plots.py draws the same numbers, log-log, in `collective_time.png`."""

from __future__ import annotations

from rich.table import Table

PARAM = "message_bytes"
BASELINE = "ring"


def collective_data(summary: dict) -> tuple[list[int], dict[str, dict[int, float]]] | None:
    """(sizes, case -> size -> p50 ms) when the run is a collective sweep with a ring to compare against."""
    cases: dict[str, dict[int, float]] = {}
    for point in summary.get("sweep") or []:
        size = point.get("point", {}).get(PARAM)
        if not isinstance(size, int | float):
            return None
        for name, span in (point.get("spans") or {}).items():
            if name.endswith(".time") and span.get("n"):
                cases.setdefault(name.removesuffix(".time"), {})[int(size)] = span["p50_ms"]
    if BASELINE not in cases or len(cases) < 2:
        return None
    return sorted({s for c in cases.values() for s in c}), cases


def crossover(ring: dict[int, float], case: dict[int, float]) -> int | None:
    """The largest message size at which `case` beat the ring (None: at no size)."""
    faster = [size for size in case if size in ring and case[size] < ring[size]]
    return max(faster) if faster else None


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def collective_table(summary: dict) -> Table | None:
    data = collective_data(summary)
    if data is None:
        return None
    sizes, cases = data
    others = [c for c in cases if c != BASELINE]
    table = Table(title="all-reduce p50 ms per message size (ring vs reconfigured per stage)", title_justify="left")
    table.add_column("message")
    for case in [BASELINE, *others]:
        table.add_column(case, justify="right")
    for size in sizes:
        row = [_size(size)]
        for case in [BASELINE, *others]:
            ms = cases[case].get(size)
            mark = "" if case == BASELINE or ms is None or ms >= cases[BASELINE].get(size, 0) else " *"
            row.append("" if ms is None else f"{ms:.1f}{mark}")
        table.add_row(*row)
    notes = []
    for case in others:
        at = crossover(cases[BASELINE], cases[case])
        notes.append(f"{case}: " + ("never faster than the ring" if at is None else f"faster up to {_size(at)}"))
    table.caption = "* faster than the ring. Crossover: " + "; ".join(notes)
    table.caption_justify = "left"
    return table
