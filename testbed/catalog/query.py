"""Reading the catalog: runs and span samples selected by the same filters, as plain dicts (docs/catalog.md).

`testbed runs` prints `select_runs`; what works across runs (report --across, trend, gate, export, testbed.runs())
builds on `select_runs` and `span_samples`. Each call first syncs the catalog with the folders (a stat per run
folder), so what it answers is what is on disk.
"""

from __future__ import annotations

import difflib
import json
import sqlite3
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np

from testbed.catalog.folder import RUN_FILE, iso
from testbed.catalog.index import sync
from testbed.catalog.owners import owner_name
from testbed.catalog.schema import catalog_path, connect
from testbed.contracts.errors import UserError

DEFAULT_RESULTS = "results"  # where `testbed run` writes (its --results default)
TARGETS = ("lab", "twin")
STATUSES = ("ok", "failed", "aborted", "running")  # a run's status in run.json (running: its runner died unhealed)
RUN_COLUMNS = (
    "id, run_id, folder, status, error, playbook, playbook_file, inventory, inventory_file, inventory_digest, target, "
    "seed, "
    "trials_planned, trials_ok, trials_failed, git_commit, git_dirty, testbed_version, versions, user, host, "
    "started, ended, format_version, torn, owner_uid"
)


def select_runs(
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    *,
    run: str | None = None,
    playbook: str | None = None,
    inventory: str | None = None,
    target: str | None = None,
    status: str | None = None,
    since: str | date | datetime | None = None,
    until: str | date | datetime | None = None,
    commit: str | None = None,
    tag: str | Iterable[str] | None = None,
    protocol: str | None = None,
    param: dict[str, str] | None = None,
    owner: Iterable[int] | None = None,
    sync_first: bool = True,
) -> list[dict]:
    """The runs under `results_dirs` (default ./results) that pass every filter given, oldest first.

    Filters: `run` a run id or folder name (or a unique start of one); `playbook`, `inventory` their names;
    `target` "lab" or "twin"; `status` ok, failed, aborted (running: a run whose runner died unhealed);
    `since`/`until` a date (UTC; `until` takes the whole day) or an ISO datetime; `commit` the start of a git
    commit; `tag` a tag, or several that must all be there; `protocol` a switch's driver or served interface;
    `param` {name: value} parameters given at run time (`testbed run --param`), all of which must hold; `owner` the
    uids whose run folders count (testbed.catalog.owners; None: anyone's).
    Each run is a dict: the runs table's columns (times as UTC ISO strings, `versions` a dict), `path` (its
    folder), `results` (its results folder), `duration_s`, `switches`, `tags` and `notes`.
    """
    where, params = _where(run, playbook, inventory, target, status, since, until, commit, tag, protocol, param, owner)
    out: list[dict] = []
    for results, conn in _catalogs(results_dirs, sync_first):
        try:
            rows = conn.execute(f"SELECT {RUN_COLUMNS} FROM runs r {where} ORDER BY started, folder", params)
            runs = [dict(row) for row in rows]
            extra = _extras(conn, [r["id"] for r in runs])
        finally:
            conn.close()
        for r in runs:
            started, ended = r["started"], r["ended"]
            r["duration_s"] = None if started is None or ended is None else round(ended - started, 3)
            r["started"], r["ended"] = iso(started), iso(ended)
            r["versions"] = json.loads(r["versions"]) if r["versions"] else {}
            r["git_dirty"] = None if r["git_dirty"] is None else bool(r["git_dirty"])
            r["owner"] = owner_name(r["owner_uid"])
            r["path"] = str(results / r["folder"])
            r["results"] = str(results)
            r.update(extra[r.pop("id")])
            out.append(r)
    out.sort(key=lambda r: (r["started"] or "", r["folder"]))
    return out


def span_samples(
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    spans: str | Iterable[str] | None = None,
    **filters,
) -> list[dict]:
    """Every measured sample of `spans` (all spans if None) in the runs `select_runs(results_dirs, **filters)`
    selects, one dict each: run_id, folder, playbook, target, git_commit, started (the run's), trial, sweep (the
    trial's sweep point, a dict), step, span, ms. Oldest run first, then in the order measured.

    One dict per sample is what a row-by-row consumer wants (export); what computes over the samples is faster with
    `span_columns`, the same samples as arrays, run by run.
    """
    names = _span_names(spans)
    sync_first = filters.pop("sync_first", True)
    where, params = _where(**filters)
    out: list[dict] = []
    for results, conn in _catalogs(results_dirs, sync_first):
        try:
            conn.row_factory = None  # tuples: a query of many runs makes hundreds of thousands of rows
            runs = _run_heads(conn, where, params)
            if not runs:
                continue
            picked = f"run IN (SELECT r.id FROM runs r {where})"
            sweeps: dict[tuple[int, int], str] = {
                (run, trial): sweep
                for run, trial, sweep in conn.execute(f"SELECT run, trial, sweep FROM trials WHERE {picked}", params)
            }
            span_clause = "" if names is None else f"span IN ({', '.join('?' * len(names))}) AND "
            # No ORDER BY: the rows come in the index's order and each run's are put in measured order (rowid) here,
            # which costs far less than SQLite sorting them all.
            rows = conn.execute(
                f"SELECT run, rowid, trial, step, span, ms FROM spans WHERE {span_clause}{picked}",
                [*(names or ()), *params],
            )
            by_run: dict[int, list[tuple]] = {}
            for row in rows:
                by_run.setdefault(row[0], []).append(row)
            parsed: dict[str | None, dict] = {}  # each sweep's text parsed once; every sample gets a dict of its own
            where_results = str(results)
            for head in runs:
                mine = by_run.get(head["id"])
                if not mine:
                    continue
                mine.sort(key=lambda row: row[1])
                fixed = {k: head[k] for k in ("run_id", "folder", "playbook", "target", "git_commit", "started")}
                for run, _rowid, trial, step, span, ms in mine:
                    text = sweeps.get((run, trial))
                    if text not in parsed:
                        parsed[text] = json.loads(text) if text else {}
                    out.append(
                        {
                            **fixed,
                            "trial": trial,
                            "sweep": dict(parsed[text]),
                            "step": step,
                            "span": span,
                            "ms": ms,
                            "results": where_results,
                        }
                    )
        finally:
            conn.close()
    if len(out) and len({s["results"] for s in out}) > 1:
        out.sort(key=lambda s: (s["started"] or "", s["folder"]))  # stable: each run's samples keep their order
    return out


def span_columns(
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    spans: str | Iterable[str] | None = None,
    **filters,
) -> list[dict]:
    """The samples of `spans` (all spans if None) in the runs `select_runs(results_dirs, **filters)` selects, as
    arrays run by run: what statistics across runs read (report --across, trend, gate).

    One dict per run that measured any of them, oldest first: run_id, folder, path, results, playbook, inventory,
    target, status, git_commit, git_dirty, started (UTC ISO), `spans` {span: ms as a numpy array} and `trials`
    {span: each sample's trial, an array of the same length}, `sweeps` {trial: its sweep point's key, sorted JSON}
    (testbed.catalog.points splits the samples by point with it), `tags` its tags. Within a run the samples are in
    trial order (within a trial, by duration): the order the covering index holds them in, so no sample is looked
    up or sorted one by one.
    """
    names = _span_names(spans)
    sync_first = filters.pop("sync_first", True)
    where, params = _where(**filters)
    out: list[dict] = []
    for results, conn in _catalogs(results_dirs, sync_first):
        try:
            conn.row_factory = None
            heads = {head["id"]: head for head in _run_heads(conn, where, params)}
            if not heads:
                continue
            picked_runs = f" WHERE run IN (SELECT r.id FROM runs r {where})" if where else ""
            for run, trial, sweep in conn.execute(f"SELECT run, trial, sweep FROM trials{picked_runs}", params):
                if run in heads:
                    heads[run].setdefault("sweeps", {})[trial] = sweep
            for head in heads.values():
                head["tags"] = []
            for run, name in conn.execute(f"SELECT run, name FROM tags{picked_runs} ORDER BY rowid", params):
                if run in heads:
                    heads[run]["tags"].append(name)
            span_names = (
                names if names is not None else [row[0] for row in conn.execute("SELECT DISTINCT span FROM spans")]
            )
            for span in span_names:
                # The covering index spans (span, run, trial, ms) answers this alone, already in (run, trial) order.
                # Unfiltered, one scan of the span's entries; filtered, a seek per selected run.
                picked = f" AND run IN (SELECT r.id FROM runs r {where})" if where else ""
                rows = conn.execute(
                    f"SELECT run, trial, ms FROM spans WHERE span = ?{picked} ORDER BY run, trial", [span, *params]
                ).fetchall()
                if not rows:
                    continue
                data = np.array(rows, dtype=float)  # a NULL trial becomes NaN
                run_ids = data[:, 0].astype(np.int64)
                cuts = np.flatnonzero(np.diff(run_ids)) + 1
                for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]]), strict=True):
                    head = heads[int(run_ids[lo])]
                    head.setdefault("spans", {})[span] = data[lo:hi, 2].copy()
                    head.setdefault("trials", {})[span] = data[lo:hi, 1].copy()
        finally:
            conn.close()
        for head in heads.values():
            if "spans" not in head:
                continue
            head.pop("id")
            head["path"], head["results"] = str(results / head["folder"]), str(results)
            out.append(head)
    out.sort(key=lambda r: (r["started"] or "", r["folder"]))
    return out


def span_counts(results_dirs: str | Path | Iterable[str | Path] | None = None, **filters) -> dict[str, dict]:
    """The spans the selected runs measured: {span: {"runs": how many runs, "samples": how many samples}}, by name.
    What `testbed spans` prints, and what an unknown span's error lists.
    """
    sync_first = filters.pop("sync_first", True)
    where, params = _where(**filters)
    out: dict[str, dict] = {}
    for _results, conn in _catalogs(results_dirs, sync_first):
        try:
            picked = f" WHERE run IN (SELECT r.id FROM runs r {where})" if where else ""
            rows = conn.execute(
                f"SELECT span, COUNT(DISTINCT run), COUNT(*) FROM spans{picked} GROUP BY span", params
            ).fetchall()
        finally:
            conn.close()
        for span, runs, samples in rows:
            entry = out.setdefault(span, {"runs": 0, "samples": 0})
            entry["runs"] += runs
            entry["samples"] += samples
    return dict(sorted(out.items()))


def unknown_spans(spans: Iterable[str], measured: Iterable[str], said: str = "the selected runs") -> str | None:
    """The error for spans no selected run measured: each with its closest measured name, and the names there are;
    None when every span was measured.
    """
    measured = list(measured)
    missing = [s for s in spans if s not in measured]
    if not missing:
        return None
    each = "; ".join(f"{s!r}{did_you_mean(s, measured)}" for s in missing)
    listed = ", ".join(measured[:30]) + (f" and {len(measured) - 30} more" if len(measured) > 30 else "")
    return f"no span {each} in {said}; they measured: {listed or 'nothing'} (`testbed spans` lists them)"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'X'?` for the closest of `choices` to a mistyped word, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _span_names(spans: str | Iterable[str] | None) -> list[str] | None:
    return [spans] if isinstance(spans, str) else list(spans) if spans is not None else None


def _run_heads(conn: sqlite3.Connection, where: str, params: list) -> list[dict]:
    """The selected runs' identity, oldest first (what each sample or column set carries of its run)."""
    keys = (
        "id", "run_id", "folder", "playbook", "inventory", "inventory_digest", "target", "status", "git_commit",
        "git_dirty", "started",
    )  # fmt: skip
    rows = conn.execute(f"SELECT r.{', r.'.join(keys)} FROM runs r {where} ORDER BY r.started, r.folder", params)
    heads = []
    for row in rows:
        head = dict(zip(keys, row, strict=True))
        head["started"] = iso(head["started"])
        head["git_dirty"] = None if head["git_dirty"] is None else bool(head["git_dirty"])
        heads.append(head)
    return heads


def resolve_run(run: str, results_dirs: str | Path | Iterable[str | Path] | None = None) -> Path:
    """The folder of RUN: a run folder's path, or a run id or folder name (or a unique start of one) under the
    results folders. UserError when it names no run (listing the closest ids) or several (listing them).
    """
    path = Path(run)
    if (path / RUN_FILE).is_file():
        return path
    dirs = results_paths(results_dirs)
    for results in dirs:
        if (results / run / RUN_FILE).is_file():
            return results / run
    where = ", ".join(str(d) for d in dirs)
    if not any(d.is_dir() for d in dirs):
        if path.is_dir():
            raise UserError(f"{run}: a folder, but not a run (no {RUN_FILE}); pass a folder `testbed run` wrote")
        raise UserError(f"{run}: neither a run folder nor a run id in {where} (no such folder; pass --results DIR)")
    every = select_runs([d for d in dirs if d.is_dir()])
    candidates = [Path(r["path"]) for r in every if r["folder"].startswith(run) or r["run_id"].startswith(run)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        if path.is_dir():
            raise UserError(f"{run}: a folder, but not a run (no {RUN_FILE}); pass a folder `testbed run` wrote")
        close = difflib.get_close_matches(run, [r["folder"] for r in every], n=3, cutoff=0.5)
        hint = f"; the closest: {', '.join(close)}" if close else ""
        raise UserError(f"no run {run!r} in {where}{hint}; `testbed runs` lists them (or pass --results DIR)")
    more = f" and {len(candidates) - 8} more" if len(candidates) > 8 else ""
    listed = ", ".join(str(c) for c in candidates[:8]) + more
    raise UserError(f"{run!r} names {len(candidates)} runs in {where}: {listed}; give more of the run id")


def results_paths(results_dirs: str | Path | Iterable[str | Path] | None) -> list[Path]:
    if results_dirs is None:
        return [Path(DEFAULT_RESULTS)]
    if isinstance(results_dirs, str | Path):
        return [Path(results_dirs)]
    return [Path(d) for d in results_dirs]


def _catalogs(results_dirs, sync_first: bool):
    for results in results_paths(results_dirs):
        if not results.is_dir():
            raise UserError(f"no results folder {results} (`testbed run` writes its runs there; pass --results DIR)")
        try:
            if sync_first:
                sync(results)
            conn = connect(results)
        except sqlite3.Error as exc:
            raise UserError(
                f"{catalog_path(results)} (the catalog of {results}): cannot open it ({exc}); "
                "`testbed runs --reindex` rebuilds it from the run folders"
            ) from None
        yield results, conn


def _extras(conn: sqlite3.Connection, ids: list[int]) -> dict[int, dict]:
    out: dict[int, dict] = {i: {"switches": [], "tags": [], "notes": [], "params": {}} for i in ids}
    if not ids:
        return out
    for row in conn.execute(
        "SELECT run, name, kind, driver, transport, interface FROM devices WHERE switch = 1 ORDER BY rowid"
    ):
        if row["run"] in out:
            keys = ("name", "kind", "driver", "transport", "interface")
            out[row["run"]]["switches"].append({k: row[k] for k in keys})
    for row in conn.execute("SELECT run, name FROM tags ORDER BY rowid"):
        if row["run"] in out:
            out[row["run"]]["tags"].append(row["name"])
    for row in conn.execute("SELECT run, name, value FROM params ORDER BY rowid"):
        if row["run"] in out:
            out[row["run"]]["params"][row["name"]] = row["value"]
    for row in conn.execute("SELECT run, text, wall, user FROM notes ORDER BY rowid"):
        if row["run"] in out:
            out[row["run"]]["notes"].append({"text": row["text"], "at": iso(row["wall"]), "user": row["user"]})
    return out


def _where(
    run=None,
    playbook=None,
    inventory=None,
    target=None,
    status=None,
    since=None,
    until=None,
    commit=None,
    tag=None,
    protocol=None,
    param=None,
    owner=None,
) -> tuple[str, list]:
    clauses: list[str] = []
    params: list = []
    if run is not None:
        clauses.append("(r.folder = ? OR r.run_id = ? OR r.folder LIKE ? ESCAPE '\\' OR r.run_id LIKE ? ESCAPE '\\')")
        prefix = _like_prefix(run)
        params += [run, run, prefix, prefix]
    if status is not None and status not in STATUSES:
        raise UserError(f"status {status!r}: one of {', '.join(STATUSES)}{did_you_mean(status, STATUSES)}")
    for column, value in (("playbook", playbook), ("inventory", inventory), ("status", status)):
        if value is not None:
            clauses.append(f"r.{column} = ?")
            params.append(value)
    if target is not None:
        if target not in TARGETS:
            raise UserError(f"target {target!r}: one of {', '.join(TARGETS)}")
        clauses.append("r.target = ?")
        params.append(target)
    if since is not None:
        clauses.append("r.started >= ?")
        params.append(_instant(since, "since", end_of_day=False))
    if until is not None:
        clauses.append("r.started < ?")
        params.append(_instant(until, "until", end_of_day=True))
    if commit is not None:
        clauses.append("r.git_commit LIKE ? ESCAPE '\\'")
        params.append(_like_prefix(commit))
    for name in [tag] if isinstance(tag, str) else list(tag or ()):
        clauses.append("r.id IN (SELECT run FROM tags WHERE name = ?)")
        params.append(name)
    if protocol is not None:
        clauses.append("r.id IN (SELECT run FROM devices WHERE switch = 1 AND (driver = ? OR interface = ?))")
        params += [protocol, protocol]
    for name, value in (param or {}).items():
        clauses.append("r.id IN (SELECT run FROM params WHERE name = ? AND value = ?)")
        params += [name, value]
    if owner is not None:
        uids = [int(u) for u in owner]
        clauses.append(f"r.owner_uid IN ({', '.join('?' * len(uids)) or 'NULL'})")
        params += uids
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _instant(value, option: str, end_of_day: bool) -> float:
    """A --since/--until value as a wall time: a date is a UTC day (until: its end), a datetime without a zone UTC."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day) + (timedelta(days=1) if end_of_day else timedelta())
    else:
        text = str(value).strip()
        try:
            if len(text) == 10:
                day = date.fromisoformat(text)
                return _instant(day, option, end_of_day)
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UserError(
                f"--{option} {text!r}: not a date; give YYYY-MM-DD (a UTC day) or YYYY-MM-DDTHH:MM[:SS][+zone]"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
