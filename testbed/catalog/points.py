"""Sweep points across runs: what `compare`, `gate`, `trend` and `report --across` compare like with like.

A playbook's sweep runs its trials at several points (rail-reconfig: mode x delay_ms); a run's samples of a span mix
the points, and so would any statistic of them all. A point is known by its key, the sweep variables' values as
sorted JSON (what the catalog's trials table and trials.csv hold, "{}" for a playbook without a sweep); a group is
one playbook at one point, and only samples of one group are compared or summarized together (docs/catalog.md).

`--sweep KEY=VALUE` selects points: a point passes when each key given has one of the values given for it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator

import numpy as np

from testbed.contracts.errors import UserError
from testbed.results.points import NO_SWEEP, point_key, point_label, point_order

__all__ = ["NO_SWEEP", "point_key", "point_label", "check_selection", "group_label", "groups", "parse_sweep"]


def group_label(playbook: str | None, key: str, with_playbook: bool) -> str:
    """A group for people: its point, after its playbook when the selection has several."""
    point = point_label(key)
    if not with_playbook:
        return point
    return f"{playbook}" if point == "-" else f"{playbook} {point}"


def key_value_parts(items: Iterable[str]) -> Iterator[tuple[str, str, str, str]]:
    """Each KEY=VALUE of command-line items, an item possibly several joined by commas: (the part as written, key,
    "=" or "" when there was none, value), stripped; empty parts skipped.
    """
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if part:
                key, eq, value = part.partition("=")
                yield part, key.strip(), eq, value.strip()


def parse_sweep(items: Iterable[str] | None) -> dict[str, set[str]]:
    """--sweep KEY=VALUE items (each possibly several joined by commas) as {key: the values allowed}; a key given
    twice allows either value. UserError for an item that is not KEY=VALUE.
    """
    wanted: dict[str, set[str]] = {}
    for part, key, eq, value in key_value_parts(items or ()):
        if not eq or not key or not value:
            raise UserError(f"--sweep {part!r}: give KEY=VALUE, a sweep variable and one of its values")
        wanted.setdefault(key, set()).add(value)
    return wanted


def _same(value, wanted: str) -> bool:
    if str(value) == wanted:
        return True
    try:  # 10 and 10.0, as a user types them
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def matches(key: str, wanted: dict[str, set[str]]) -> bool:
    """Whether the point of `key` passes the --sweep selection `wanted`."""
    if not wanted:
        return True
    point = json.loads(key)
    return all(k in point and any(_same(point[k], v) for v in values) for k, values in wanted.items())


def check_selection(wanted: dict[str, set[str]], keys: Iterable[str]) -> None:
    """UserError when --sweep names a variable no selected run swept, or selects none of the points there are:
    it lists the variables (the closest first) or the points.
    """
    if not wanted:
        return
    keys = list(dict.fromkeys(keys))
    variables = sorted({k for key in keys for k in json.loads(key)})
    for name in wanted:
        if name not in variables:
            close = difflib.get_close_matches(name, variables, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            listed = ", ".join(variables) if variables else "none: the selected runs have no sweep"
            raise UserError(f"--sweep {name}: no selected run swept {name!r}{hint} (sweep variables: {listed})")
    if not any(matches(key, wanted) for key in keys):
        listed = "; ".join(point_label(k) for k in keys[:12]) + (" ..." if len(keys) > 12 else "")
        raise UserError(f"--sweep selects none of the sweep points measured: {listed}")


def run_points(run: dict, span: str) -> dict[str, np.ndarray]:
    """One run's samples of `span` (a run of span_columns) split by sweep point: {key: ms}, in the order measured."""
    values = run["spans"][span]
    trials = run["trials"][span]
    sweeps = run.get("sweeps") or {}
    keys = np.array([sweeps.get(int(t), NO_SWEEP) if np.isfinite(t) else NO_SWEEP for t in trials], dtype=object)
    out: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(keys.tolist()):
        out[key] = values[keys == key]
    return out


def groups(runs: list[dict], span: str, wanted: dict[str, set[str]] | None = None) -> dict[tuple, list[tuple]]:
    """The samples of `span` grouped by (playbook, point key): {group: [(run, its samples there)...]}, groups in the
    order first measured, runs oldest first; only the points `wanted` selects (parse_sweep).
    """
    out: dict[tuple, list[tuple]] = {}
    for run in runs:
        if span not in run["spans"]:
            continue
        for key, values in run_points(run, span).items():
            if len(values) and matches(key, wanted or {}):
                out.setdefault((run["playbook"], key), []).append((run, values))
    return out


def sort_groups(keys: Iterable[tuple]) -> list[tuple]:
    """Groups in a reading order: by playbook, then point by point with numbers in numeric order."""

    return sorted(keys, key=lambda group: (group[0] or "", point_order(group[1])))
