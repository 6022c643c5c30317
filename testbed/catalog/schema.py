"""The catalog's SQLite file: its tables and how a process opens it (docs/catalog.md says why SQLite).

The file is derived data: every row comes from a run folder, so a file of another schema version is emptied and
rebuilt from the folders rather than migrated.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 5
# A run ending while another process writes waits this long for the lock; SQLite's writer holds it for the time
# of one run's insert (milliseconds), or a whole reindex (seconds).
BUSY_TIMEOUT_S = 60.0

TABLES = {
    # Child rows refer to their run by `id` (an integer: a span sample's row stays small). One row per run folder,
    # known by the folder's name inside its results folder (a copied folder keeps its run id
    # but not its name). `signature` is what the folder looked like when it was indexed (sizes and mtimes): a
    # folder whose signature changed (heal rewrote run.json, a tag was added) is indexed again. `owner_uid`: the
    # account that owns the folder and every file indexed from it (-1 when they differ): what the kernel says, which
    # no one but root can forge, unlike run.json's `user` (docs/run-folders.md).
    "runs": """
        id INTEGER PRIMARY KEY, folder TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL, status TEXT, error TEXT,
        playbook TEXT, playbook_file TEXT, inventory TEXT, inventory_file TEXT, inventory_digest TEXT, target TEXT,
        seed INTEGER, trials_planned INTEGER, trials_ok INTEGER, trials_failed INTEGER,
        git_commit TEXT, git_dirty INTEGER, testbed_version TEXT, versions TEXT,
        user TEXT, host TEXT, started REAL, ended REAL, format_version INTEGER,
        torn TEXT, owner_uid INTEGER, signature TEXT NOT NULL, indexed_at REAL NOT NULL
    """,
    # Every device of the run's inventory; a switch's protocol is its driver (and the interface the twin served).
    # `switch`: its family holds circuits (1), not (0), or a family this install does not know (NULL).
    "devices": """
        run INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT, switch INTEGER, driver TEXT, transport TEXT,
        interface TEXT
    """,
    "trials": "run INTEGER NOT NULL, trial INTEGER NOT NULL, sweep TEXT NOT NULL, status TEXT",
    "spans": "run INTEGER NOT NULL, trial INTEGER, step TEXT, span TEXT NOT NULL, ms REAL NOT NULL, wall REAL",
    "milestones": "run INTEGER NOT NULL, trial INTEGER, name TEXT NOT NULL, device TEXT, mono_ns INTEGER, wall REAL",
    "faults": """
        run INTEGER NOT NULL, trial INTEGER, fault TEXT NOT NULL, kind TEXT, target TEXT,
        injected TEXT, healed TEXT, inject_wall REAL, heal_wall REAL
    """,
    "tags": "run INTEGER NOT NULL, name TEXT NOT NULL, wall REAL, user TEXT",
    "notes": "run INTEGER NOT NULL, text TEXT NOT NULL, wall REAL, user TEXT",
    # `testbed run --param k=v` (and testbed.catalog.add_param): one row per name, its last value.
    "params": "run INTEGER NOT NULL, name TEXT NOT NULL, value TEXT",
}
INDEXES = (
    # Covering: a span's samples across runs are read from this index alone, in run order (docs/catalog.md).
    "CREATE INDEX spans_by_span ON spans (span, run, trial, ms)",
    "CREATE INDEX spans_by_run ON spans (run)",
    "CREATE INDEX trials_by_run ON trials (run, trial)",
    "CREATE INDEX runs_by_start ON runs (started)",
    "CREATE INDEX runs_by_owner ON runs (owner_uid)",
    *(f"CREATE INDEX {t}_by_run ON {t} (run)" for t in ("devices", "milestones", "faults", "notes", "params")),
    "CREATE INDEX tags_by_name ON tags (name, run)",
)
CHILD_TABLES = tuple(t for t in TABLES if t != "runs")


def catalog_dir() -> Path:
    """Where this user's catalogs live: $TESTBED_CATALOG_DIR, else the user's cache folder.

    Not in the results folder: that folder holds run folders only (scripts list it), may be shared with other users
    (who could rewrite a file there) or read-only, and the catalog is derived data, rebuilt from it at will.
    """
    env = os.environ.get("TESTBED_CATALOG_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "testbed" / "catalogs"


def catalog_path(results_dir: Path) -> Path:
    """The catalog of one results folder: one file per folder (by its resolved path) in this user's catalog_dir."""
    resolved = Path(results_dir).resolve()
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
    return catalog_dir() / f"{resolved.name}-{key}.db"


def connect(results_dir: Path) -> sqlite3.Connection:
    """The catalog of one results folder, created if missing, at this schema version.

    WAL lets readers go on while one process writes; the busy timeout makes writers that end at the same time queue
    for the lock instead of failing. Every write is one `BEGIN IMMEDIATE` transaction (testbed.catalog.index), so a
    writer takes the lock before it reads what it will change.
    """
    path = catalog_path(results_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: no other user writes this user's numbers
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA journal_mode = WAL")  # persistent: set once, by the first process to open the file
    conn.execute("PRAGMA synchronous = NORMAL")  # WAL's safe setting: a power cut loses the last commits, not the file
    _ensure_schema(conn)
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have done it meanwhile
        if version != SCHEMA_VERSION:
            for table in TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for table, columns in TABLES.items():
                conn.execute(f"CREATE TABLE {table} ({columns})")
            for statement in INDEXES:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
