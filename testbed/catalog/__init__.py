"""The catalog: every run under a results folder indexed in one SQLite file (in the user's cache, one per results
folder), which the run folders can always rebuild (docs/catalog.md).

The names below load on first use: a run imports this package for its end (index_at_end) and `testbed run`'s
--tag and --note for annotations, neither of which needs the queries (and numpy under them), and a command's start
is the time a user waits for (docs/tuning.md, "A command's start").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.catalog.annotations import add_note, add_tag
    from testbed.catalog.folder import NotIndexed
    from testbed.catalog.index import IndexReport, index_at_end, index_run, reindex, sync
    from testbed.catalog.query import resolve_run, select_runs, span_columns, span_samples

_PUBLIC = {
    "add_note": "testbed.catalog.annotations",
    "add_tag": "testbed.catalog.annotations",
    "NotIndexed": "testbed.catalog.folder",
    "IndexReport": "testbed.catalog.index",
    "index_at_end": "testbed.catalog.index",
    "index_run": "testbed.catalog.index",
    "reindex": "testbed.catalog.index",
    "sync": "testbed.catalog.index",
    "resolve_run": "testbed.catalog.query",
    "select_runs": "testbed.catalog.query",
    "span_columns": "testbed.catalog.query",
    "span_samples": "testbed.catalog.query",
}

__all__ = [
    "IndexReport",
    "NotIndexed",
    "add_note",
    "add_tag",
    "index_at_end",
    "index_run",
    "reindex",
    "resolve_run",
    "select_runs",
    "span_columns",
    "span_samples",
    "sync",
]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'testbed.catalog' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
