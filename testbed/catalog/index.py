"""Writing the catalog: one run as it ends, the folders that changed since (sync), or all of them (reindex).

Each write is one `BEGIN IMMEDIATE` transaction: a run's rows are replaced whole or not at all, and processes that
write at once queue on SQLite's lock (testbed.catalog.schema.connect). The folders stay the source of truth, so a
run the catalog missed (its index failed, it was copied in, heal rewrote it) is picked up by the next sync.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
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


class IndexBehind:
    """A warm session's end-of-run indexing (testbed.Lab with index_behind=True, as testbed serve makes it): each run
    ended is indexed in a thread of its own once the next run has sent its first command, or after WAIT_S when no
    run follows, so a queued run does not wait for the catalog. At most BACKLOG runs wait (a run's end waits for a
    place); flush() returns once every run handed over is indexed. Whoever reads the catalog meanwhile brings it up
    to the folders first (sync), so a run not yet indexed here is found all the same.
    """

    WAIT_S = 1.0  # no next run by then: index now (a queue's next run has started well before)
    BACKLOG = 4

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn  # index_at_end's warnings, told as the run's end would have printed them
        self._todo: queue.Queue[Path | None] = queue.Queue(maxsize=self.BACKLOG)
        self._next_started = threading.Event()
        self._thread = threading.Thread(target=self._index, name="catalog-index-behind", daemon=True)
        self._thread.start()

    def add(self, run_dir: Path) -> None:
        """A run that ended, its folder whole: indexed after the next run's first command."""
        self._next_started.clear()
        self._todo.put(Path(run_dir))

    def next_run_started(self) -> None:
        """The session's next run has sent its first command: what waits is indexed now."""
        self._next_started.set()

    def flush(self) -> None:
        """Every run handed over indexed (now, not after the next run's start)."""
        self._next_started.set()
        self._todo.join()

    def close(self) -> None:
        """Flushed, the thread ended."""
        self.flush()
        self._todo.put(None)
        self._thread.join()

    def _index(self) -> None:
        while True:
            run_dir = self._todo.get()
            try:
                if run_dir is None:
                    return
                self._next_started.wait(self.WAIT_S)
                warning = index_at_end(run_dir)
                if warning is not None:
                    self.warn(warning)
            except Exception:  # noqa: BLE001 (a warning that cannot be told leaves the runs after it indexed)
                log.warning("catalog: telling a warning about %s failed", run_dir, exc_info=True)
            finally:
                self._todo.task_done()


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
