"""A selection of runs as flat tables: every span sample with its run's provenance, and the runs themselves; written
as CSV (standard library) or Parquet (pyarrow), and what `testbed.runs()` turns into a DataFrame (docs/catalog.md).

Every cell is a scalar, so the same columns serve a CSV reader, Parquet and pandas: a run's lists (switches, their
protocols, tags) are joined by spaces (a tag is one word, a device name or driver has no space), and what is
nested (the sweep point, versions, notes) is JSON text; each sweep key also gets a column of its own.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TextIO

from testbed.catalog.query import select_runs, span_samples
from testbed.contracts.errors import UserError
from testbed.events.safe_files import atomic_writer

ANALYSIS_EXTRA = "pip install 'testbed[analysis]'"
FORMATS = ("csv", "parquet")
FILTERS = (
    "run",
    "playbook",
    "inventory",
    "target",
    "status",
    "since",
    "until",
    "commit",
    "tag",
    "protocol",
    "param",
    "owner",
)

# The type of each column (how Parquet and pandas hold it; CSV writes text): str, int, float, bool, time (UTC),
# json (text). A sweep key's column (sweep.NAME) holds what the playbook's sweep gave.
RUN_PROVENANCE = {
    "run_id": "str",
    "folder": "str",
    "results": "str",
    "status": "str",
    "playbook": "str",
    "inventory": "str",
    "target": "str",
    "protocols": "str",
    "switches": "str",
    "seed": "int",
    "git_commit": "str",
    "git_dirty": "bool",
    "testbed_version": "str",
    "user": "str",  # what run.json says
    "owner": "str",  # the folder's owner, as the kernel says
    "host": "str",
    "started": "time",
    "ended": "time",
    "tags": "str",
}
SAMPLE = {"trial": "int", "sweep": "json", "step": "str", "span": "str", "ms": "float"}
RUNS = {
    **RUN_PROVENANCE,
    "path": "str",
    "error": "str",
    "playbook_file": "str",
    "inventory_file": "str",
    "trials_planned": "int",
    "trials_ok": "int",
    "trials_failed": "int",
    "duration_s": "float",
    "versions": "json",
    "format_version": "int",
    "torn": "str",
    "notes": "json",
}


@dataclass
class Table:
    """Columns in order, with the type of each (see RUN_PROVENANCE).

    In the samples' table a run's provenance is held once per run: the columns named in `per_run` have a value per
    run, and `repeat` gives each sample's run (its row there). `column()` spreads them out; pandas and pyarrow
    spread them with a take, which is what keeps 300,000 samples cheap.
    """

    columns: dict[str, list]
    types: dict[str, str]
    repeat: list[int] | None = None
    per_run: frozenset[str] = frozenset()

    def __len__(self) -> int:
        if self.repeat is not None:
            return len(self.repeat)
        return len(next(iter(self.columns.values()), []))

    def column(self, name: str, cell=None) -> list:
        """Every row's value of `name` (each passed through `cell` first, if given)."""
        values = self.columns[name]
        if cell is not None:
            values = [cell(v) for v in values]
        if name in self.per_run:
            assert self.repeat is not None  # a table with per-run columns has each row's run
            return [values[i] for i in self.repeat]
        return values


@dataclass
class Selection:
    samples: Table  # one row per span sample, its run's provenance first
    runs: Table  # one row per run, samples or not


def select(
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    spans: str | Iterable[str] | None = None,
    **filters,
) -> Selection:
    """The runs `select_runs(results_dirs, **filters)` selects, and the samples of `spans` (all if None) they hold."""
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise TypeError(f"unknown filter {', '.join(unknown)}; the filters are {', '.join(FILTERS)}")
    runs = [_run_row(r) for r in select_runs(results_dirs, **filters)]
    # Without a second sync: the samples are those of the runs just listed (a run indexed in between is left out).
    samples = span_samples(results_dirs, spans, **filters, sync_first=False)
    row_of = {(r["results"], r["folder"]): i for i, r in enumerate(runs)}
    repeat: list[int] = []
    kept: list[dict] = []
    for s in samples:
        i = row_of.get((s["results"], s["folder"]))
        if i is not None:
            repeat.append(i)
            kept.append(s)
    sweep_keys: dict[str, None] = {}
    for s in kept:
        if s["sweep"]:
            sweep_keys.update(dict.fromkeys(s["sweep"]))
    columns: dict[str, list] = {name: [r[name] for r in runs] for name in RUN_PROVENANCE}
    columns["trial"] = [s["trial"] for s in kept]
    columns["sweep"] = [json.dumps(s["sweep"]) if s["sweep"] else "{}" for s in kept]
    for name in ("step", "span", "ms"):
        columns[name] = [s[name] for s in kept]
    for key in sweep_keys:
        columns[f"sweep.{key}"] = [s["sweep"].get(key) for s in kept]
    types = {**RUN_PROVENANCE, **SAMPLE, **{f"sweep.{k}": "any" for k in sweep_keys}}
    run_table = {name: [r[name] for r in runs] for name in RUNS}
    return Selection(
        Table(columns, types, repeat=repeat, per_run=frozenset(RUN_PROVENANCE)), Table(run_table, dict(RUNS))
    )


def _run_row(r: dict) -> dict:
    """A select_runs dict as scalars (module docstring)."""
    switches = r["switches"]
    row = {name: r.get(name) for name in RUNS}
    row["protocols"] = " ".join(dict.fromkeys(s["driver"] for s in switches if s["driver"]))
    row["switches"] = " ".join(f"{s['name']}={s['driver']}" for s in switches)
    row["tags"] = " ".join(r["tags"])
    row["versions"] = json.dumps(r["versions"], sort_keys=True)
    row["notes"] = json.dumps(r["notes"])
    return row


def require_pyarrow(what: str):
    """pyarrow, or a UserError naming what to install."""
    try:
        import pyarrow
    except ImportError:
        raise UserError(
            f"{what} needs pyarrow, which is not installed: {ANALYSIS_EXTRA} (or pip install pyarrow)"
        ) from None
    return pyarrow


def write(selection: Selection, out: str | Path, fmt: str) -> list[tuple[Path | None, int]]:
    """Write the samples to `out` and the runs beside it (NAME.runs.EXT); `out` "-": the samples' CSV on stdout.

    Each file appears whole or not at all (written aside, then renamed). Returns (file, rows) of each written.
    """
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    if str(out) == "-":
        if fmt != "csv":
            raise UserError("--out -: only CSV goes to standard output; give --out FILE for Parquet")
        _write_csv(selection.samples, sys.stdout)
        sys.stdout.flush()
        return [(None, len(selection.samples))]
    path = Path(out)
    suffix = f".{fmt}"
    stem = path.name[: -len(suffix)] if path.name.endswith(suffix) else path.name
    runs_path = path.with_name(f"{stem}.runs{suffix}")
    if not path.parent.is_dir():
        raise UserError(f"--out {out}: no folder {path.parent}")
    writer = _write_parquet if fmt == "parquet" else _csv_file
    if fmt == "parquet":
        require_pyarrow("--format parquet")
    done: list[tuple[Path | None, int]] = []
    for table, target in ((selection.samples, path), (selection.runs, runs_path)):
        # Aside under a random name created exclusively (a link planted under a name we would pick is never
        # written through), then renamed over the target.
        with atomic_writer(target) as stream:
            writer(table, stream)
        done.append((target, len(table)))
    return done


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)  # a float's str is its repr: read back, the same number


def _write_csv(table: Table, stream: TextIO) -> None:
    out = csv.writer(stream, lineterminator="\n")
    out.writerow(table.columns)
    out.writerows(zip(*(table.column(name, _csv_cell) for name in table.columns), strict=True))


def _csv_file(table: Table, stream: IO[bytes]) -> None:
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
    _write_csv(table, text)
    text.flush()
    text.detach()  # the stream is its writer's to close


def arrow_table(table: Table):
    """The table as a pyarrow.Table, each column of its type (times: UTC timestamps)."""
    pa = require_pyarrow("a Parquet export")
    kinds = {
        "str": pa.string(),
        "json": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "time": pa.timestamp("us", tz="UTC"),
    }
    arrays = {}
    for name, values in table.columns.items():
        kind = table.types[name]
        if kind == "time":
            values = [None if v is None else datetime.fromisoformat(v) for v in values]
        if kind in kinds:
            array = pa.array(values, type=kinds[kind])
        else:
            try:  # a sweep key: numbers stay numbers; a key whose values mix types is written as JSON text
                array = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                array = pa.array([None if v is None else json.dumps(v) for v in values], type=pa.string())
        arrays[name] = array.take(pa.array(table.repeat, pa.int64())) if name in table.per_run else array
    return pa.table(arrays)


def _write_parquet(table: Table, stream: IO[bytes]) -> None:
    import pyarrow.parquet as pq

    pq.write_table(arrow_table(table), stream)
