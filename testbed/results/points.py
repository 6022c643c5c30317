"""A sweep point's key and label: how a run's own files, the catalog and every command across runs name a point.

A point's key is the sweep variables' values as JSON with sorted keys (what trials.csv's `sweep` column and the
catalog's trials table hold; "{}" for a playbook without a sweep); its label is for people: `delay_ms=10 mode=static`.
"""

from __future__ import annotations

import json

NO_SWEEP = "{}"


def point_key(point: dict | None) -> str:
    """A sweep point's key: its values as JSON with sorted keys ("{}" for none)."""
    return json.dumps(point or {}, sort_keys=True)


def point_label(key: str | dict | None) -> str:
    """A point for people: `delay_ms=10 mode=static`, or `-` for a run without a sweep."""
    point = json.loads(key) if isinstance(key, str) and key else key if isinstance(key, dict) else {}
    return " ".join(f"{k}={v}" for k, v in point.items()) or "-"


def point_order(key: str) -> list:
    """A sort key that reads well: variable by variable, numbers in numeric order, before text."""
    point = json.loads(key)
    return [(k, (0, v, "") if isinstance(v, int | float) else (1, 0, str(v))) for k, v in point.items()]
