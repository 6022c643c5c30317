"""The catalog: every run under a results folder indexed in one SQLite file (in the user's cache, one per results
folder), which the run folders can always rebuild (docs/catalog.md).
"""

from testbed.catalog.annotations import add_note, add_tag
from testbed.catalog.folder import NotIndexed
from testbed.catalog.index import IndexReport, index_at_end, index_run, reindex, sync
from testbed.catalog.query import resolve_run, select_runs, span_columns, span_samples

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
