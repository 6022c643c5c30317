"""Writing the catalog: one run as it ends, the folders that changed since (sync), or all of them (reindex).

Each write is one `BEGIN IMMEDIATE` transaction: a run's rows are replaced whole or not at all, and processes that
write at once queue on SQLite's lock (testbed.catalog.schema.connect). The folders stay the source of truth, so a
run the catalog missed (its index failed, it was copied in, heal rewrote it) is picked up by the next sync.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.catalog.folder import NotIndexed, RunRows, read_run, signature
from testbed.catalog.schema import CHILD_TABLES, connect

log = logging.getLogger(__name__)
SYNC_CHUNK = 50


@dataclass
class IndexReport:
    """What an index pass did: folders indexed, left as they were, removed (gone from disk), skipped and why."""

    indexed: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (folder, reason)


def index_run(run_dir: Path) -> None:
    """Index one run folder into its results folder's catalog (the folder's parent); NotIndexed if it is not a
    run or is damaged.
    """
    run_dir = Path(run_dir)
    rows = read_run(run_dir, time.time())
    conn = connect(run_dir.parent)
    try:
        _write(conn, [rows], [])
    finally:
        conn.close()


def index_at_end(run_dir: Path) -> str | None:
    """The hook where a run ends (testbed.engine.run): index it, and never fail the run for it. Returns a warning
    to show the user, or None; `testbed runs` indexes any run missed here.
    """
    try:
        index_run(run_dir)
    except NotIndexed as exc:
        return f"catalog: {run_dir.name} not indexed: {exc}"
    except Exception as exc:  # noqa: BLE001 (whatever it is, the run's folder is whole and the run stands)
        log.warning("catalog: indexing %s failed", run_dir, exc_info=True)
        return f"catalog: {run_dir.name} not indexed ({exc}); `testbed runs` indexes it later"
    return None


def sync(results_dir: Path) -> IndexReport:
    """Bring the catalog up to the folders: index new and changed runs, drop rows of folders gone from disk."""
    return _pass(Path(results_dir), rebuild=False)


def reindex(results_dir: Path) -> IndexReport:
    """Rebuild the catalog from every folder, in one transaction (readers see the old catalog until it commits)."""
    return _pass(Path(results_dir), rebuild=True)


def _pass(results_dir: Path, rebuild: bool) -> IndexReport:
    report = IndexReport()
    if not results_dir.is_dir():
        return report
    folders = sorted(p for p in results_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    conn = connect(results_dir)
    try:
        known = dict(conn.execute("SELECT folder, signature FROM runs").fetchall())
        todo = [p for p in folders if rebuild or known.get(p.name) != signature(p)]
        report.unchanged = len(folders) - len(todo)
        present = {p.name for p in folders}
        report.removed = [f for f in known if f not in present]

        def rows_of(paths: list[Path]):
            now = time.time()
            for path in paths:
                try:
                    yield read_run(path, now)
                except NotIndexed as exc:
                    report.skipped.append((path.name, str(exc)))
                    if path.name in known:  # once a run, now damaged: its rows go
                        report.removed.append(path.name)
                        yield path.name
                    continue
                report.indexed.append(path.name)

        if rebuild:  # one transaction: readers see the old catalog until the new one is whole
            _write(conn, rows_of(todo), [], rebuild=True)
        else:  # a transaction per chunk: a run ending meanwhile waits for one chunk, not the whole pass
            _write(conn, (), report.removed)
            for start in range(0, len(todo), SYNC_CHUNK):
                _write(conn, rows_of(todo[start : start + SYNC_CHUNK]), [])
    finally:
        conn.close()
    return report


def _write(conn: sqlite3.Connection, batch: Iterable[RunRows | str], drop: list[str], rebuild: bool = False) -> None:
    """Replace the rows of each run in `batch` (a bare folder name: drop its rows) and drop those of `drop`."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if rebuild:
            for table in ("runs", *CHILD_TABLES):
                conn.execute(f"DELETE FROM {table}")
        for folder in drop:
            _delete(conn, folder)
        for rows in batch:
            if isinstance(rows, str):
                _delete(conn, rows)
                continue
            _delete(conn, rows.run["folder"])
            run = _insert(conn, "runs", [rows.run])
            for table in CHILD_TABLES:
                _insert(conn, table, [{"run": run, **row} for row in rows.children.get(table, [])])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _delete(conn: sqlite3.Connection, folder: str) -> None:
    found = conn.execute("SELECT id FROM runs WHERE folder = ?", (folder,)).fetchone()
    if found is None:
        return
    for table in CHILD_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE run = ?", (found[0],))
    conn.execute("DELETE FROM runs WHERE id = ?", (found[0],))


def _insert(conn: sqlite3.Connection, table: str, rows: list[dict]) -> int | None:
    """Insert rows (all with the same keys); the last row's id."""
    if not rows:
        return None
    columns = list(rows[0])
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    if len(rows) == 1:
        return conn.execute(sql, tuple(rows[0][c] for c in columns)).lastrowid
    conn.executemany(sql, [tuple(row[c] for c in columns) for row in rows])
    return None
