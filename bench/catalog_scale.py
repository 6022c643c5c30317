"""The catalog at scale: indexing 1,000 runs of 100 trials, a trend query over them against the pandas script a
user would write over the same folders, the catalog's size on disk, and indexing's share of a run's command.

One real `testbed run playbooks/ocs-reconfig.yaml --emulate --trials 100` (a subprocess, timed as a user waits for
it) is copied under new run ids and start times (tests/catalog/catalog_copies.py) into a results folder of RUNS
runs, which `testbed.catalog.sync` indexes. Then, in alternating rounds, a span's per-run medians for every run:
- catalog: `span_columns(results, "reconfig.total")` (with its sync: a stat per folder), what `testbed trend`,
  `report --across` and `gate` read, medians per run;
- DataFrame: `testbed.runs(results, spans="reconfig.total")`, `groupby("run_id").ms.median()`;
- pandas baseline: for every folder, run.json (its start, to order the trend) and `pd.read_csv(trials.csv)`,
  the span's rows, their median.
The three must agree run by run. Indexing's share: one run's `index_run` (into the catalog of RUNS runs, the median
of a few) over the wall time of its `testbed run` command.

    python bench/catalog_scale.py [--runs 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import REPO, compile_project, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "catalog"))
from catalog_copies import copy_run  # noqa: E402

SPAN = "reconfig.total"
TRIALS = 100
INDEX_REPEATS = 5


def real_run(results: Path) -> tuple[Path, float]:
    """A `--trials 100` run made as a user makes it; (its folder, the command's wall time in seconds)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "run", "playbooks/ocs-reconfig.yaml", "--emulate"]
        + ["--trials", str(TRIALS), "--results", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"testbed run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: ")), wall


def catalog_medians(results: Path) -> dict[str, float]:
    from testbed.catalog import span_columns

    return {run["run_id"]: statistics.median(run["spans"][SPAN].tolist()) for run in span_columns(results, SPAN)}


def dataframe_medians(results: Path) -> dict[str, float]:
    import testbed

    df = testbed.runs(results, spans=SPAN)
    return df.groupby("run_id", sort=False)["ms"].median().to_dict()


def pandas_medians(results: Path) -> dict[str, float]:
    """What a user writes without the catalog: every folder's run.json and trials.csv, read with pandas."""
    import pandas as pd

    rows = []
    for folder in sorted(p for p in results.iterdir() if (p / "run.json").is_file()):
        info = json.loads((folder / "run.json").read_text())
        trials = pd.read_csv(folder / "trials.csv")
        rows.append((info["clock"]["wall_start"], info["run"], trials.loc[trials["span"] == SPAN, "duration_ms"]))
    rows.sort(key=lambda r: r[0])
    return {run: float(ms.median()) for _, run, ms in rows}


def catalog_bytes(results: Path) -> int:
    from testbed.catalog.schema import catalog_path

    db = catalog_path(results)
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def measure(runs: int = 1000, rounds: int = 3, console: Console | None = None) -> dict:
    from testbed.catalog import index_run, sync

    console = console or Console()
    work = Path(tempfile.mkdtemp(prefix="bench-catalog-"))
    # The catalogs (the real run's and the copies') beside the folders, removed with them, not in the user's cache;
    # the real run's subprocess inherits it.
    os.environ["TESTBED_CATALOG_DIR"] = str(work / "catalogs")
    try:
        source, command_s = real_run(work / "source")
        console.print(f"a {TRIALS}-trial run: {command_s:.1f} s ({source.name})")
        results = work / "results"
        results.mkdir()
        start = time.monotonic()
        for i in range(runs):
            copy_run(source, results, i, started_offset_s=60.0 * i)
        copy_s = time.monotonic() - start
        folder_bytes = sum(f.stat().st_size for f in results.rglob("*") if f.is_file())
        start = time.monotonic()
        report = sync(results)
        index_s = time.monotonic() - start
        if len(report.indexed) != runs or report.skipped:
            raise RuntimeError(f"indexed {len(report.indexed)} of {runs} runs; skipped {report.skipped[:3]}")
        console.print(f"{runs} runs copied in {copy_s:.0f} s, indexed in {index_s:.1f} s")
        size = catalog_bytes(results)

        # One run's indexing, as its end does it, into a catalog that holds the others.
        one = results / f"{source.name}-copy0000"
        index_times = []
        for _ in range(INDEX_REPEATS):
            start = time.perf_counter()
            index_run(one)
            index_times.append(time.perf_counter() - start)

        import pandas  # noqa: F401 (loaded before the rounds, as in a notebook: no import is timed)

        ways = {"catalog": catalog_medians, "dataframe": dataframe_medians, "pandas": pandas_medians}
        times: dict[str, list[float]] = {name: [] for name in ways}
        answers: dict[str, dict[str, float]] = {}
        order = list(ways)
        for r in range(rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:  # the first turns by round
                start = time.perf_counter()
                answers[name] = ways[name](results)
                times[name].append(time.perf_counter() - start)
            console.print(
                f"round {r + 1}: " + ", ".join(f"{name} {times[name][-1]:.2f} s" for name in ways), highlight=False
            )
        base = answers["pandas"]
        for name in ("catalog", "dataframe"):
            got = answers[name]
            if list(got) != list(base) or any(abs(got[k] - base[k]) > 1e-6 for k in base):
                raise RuntimeError(f"{name}'s per-run medians differ from the pandas baseline's")
        medians = {name: statistics.median(t) for name, t in times.items()}
        index_one = statistics.median(index_times)
        return {
            "runs": runs,
            "trials": TRIALS,
            "span": SPAN,
            "samples": runs * TRIALS * 3,
            "command_s": command_s,
            "copy_s": copy_s,
            "index_all_s": index_s,
            "index_per_run_ms": 1000 * index_s / runs,
            "index_one_run_s": stats(index_times),
            "index_share": index_one / command_s,
            "catalog_bytes": size,
            "folder_bytes": folder_bytes,
            "query_s": {name: stats(t) for name, t in times.items()},
            "query_p50_s": medians,
            "ratio_catalog_vs_pandas": medians["catalog"] / medians["pandas"],
            "ratio_dataframe_vs_pandas": medians["dataframe"] / medians["pandas"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    compile_project()
    figures = measure(args.runs, args.rounds)
    print(json.dumps(figures, indent=2))
    write_out("catalog_scale", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
