"""`testbed.runs()` as a notebook uses it: runs made by `python -m testbed run` on the twin and tagged with
`testbed runs tag`, then a DataFrame filtered by tag, grouped by span, whose medians are the run's own summary.
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import testbed
from testbed.cli.main import main

# The module's two runs (real `testbed run` processes, each starting Ray and the twin) are made inside the first
# test's time bound: past the suite's 120 s default on a busy machine.
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tagged_runs(testbed_run, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(results folder, a run tagged baseline, a run of seed 7 tagged candidate), each of three trials."""
    results = tmp_path_factory.mktemp("notebook") / "results"
    args = ("playbooks/ocs-reconfig.yaml", "--emulate", "--trials", "3", "--results", str(results))
    first = testbed_run(*args)
    second = testbed_run(*args, "--seed", "7")
    assert main(["runs", "tag", first.name, "baseline", "--results", str(results)]) == 0
    assert main(["runs", "tag", second.name, "candidate", "--results", str(results)]) == 0
    return results, first, second


def trials_csv_medians(run_dir: Path) -> dict[str, float]:
    with (run_dir / "trials.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    spans = {r["span"] for r in rows}
    return {s: statistics.median(float(r["duration_ms"]) for r in rows if r["span"] == s) for s in spans}


def test_a_tag_selects_a_run_whose_span_medians_are_its_summary(tagged_runs):
    results, first, second = tagged_runs
    df = testbed.runs(results, tag="candidate")
    assert set(df["run_id"]) == {second.name} and set(df["tags"]) == {"candidate"}
    assert len(df) == 3 * 3 * 3  # three trials, three configurations, three spans
    medians = df.groupby("span")["ms"].median()
    assert medians.to_dict() == pytest.approx(trials_csv_medians(second), abs=1e-9)
    summary = pd.read_json(second / "summary.json", typ="series")["spans"]
    assert medians.to_dict() == pytest.approx({s: v["p50_ms"] for s, v in summary.items()}, abs=1e-4)


def test_both_runs_side_by_side_with_their_provenance(tagged_runs):
    results, first, second = tagged_runs
    df = testbed.runs(results, spans="reconfig.total", target="twin", protocol="polatis-scpi")
    per_run = df.groupby(["seed", "run_id"])["ms"].median()
    assert per_run.to_dict() == pytest.approx(
        {
            (0, first.name): trials_csv_medians(first)["reconfig.total"],
            (7, second.name): trials_csv_medians(second)["reconfig.total"],
        },
        abs=1e-9,
    )
    assert set(df["span"]) == {"reconfig.total"} and set(df["protocols"]) == {"polatis-scpi"}
    assert str(df["started"].dtype) == "datetime64[us, UTC]" and df["started"].is_monotonic_increasing
    assert df["trial"].tolist() == sorted(df["trial"].tolist()[:9]) + sorted(df["trial"].tolist()[9:])
    assert testbed.runs(results, tag=["baseline", "candidate"]).empty  # no run has both
    assert testbed.runs(results, tag="baseline")["run_id"].unique().tolist() == [first.name]


def test_mistakes_in_a_notebook_say_what_to_do(tagged_runs, tmp_path):
    results = tagged_runs[0]
    with pytest.raises(TypeError, match="unknown filter seed; the filters are run, playbook"):
        testbed.runs(results, seed=7)
    with pytest.raises(testbed.UserError, match="no results folder"):
        testbed.runs(tmp_path / "nowhere")
    # pandas made unimportable in a fresh interpreter, as where the analysis extra is not installed.
    probe = (
        "import sys\n"
        "sys.modules['pandas'] = None\n"
        "import testbed\n"
        "try:\n"
        f"    testbed.runs({str(results)!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pip install 'testbed[analysis]'" in done.stdout
