"""`testbed export` as a user types it: CSV and Parquet of the selected runs' samples with their provenance, read
back row for row against the catalog; the runs beside them; filters; stdout; and the mistakes a user makes.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from testbed.catalog import select_runs, span_samples
from testbed.cli.main import main

REPO = Path(__file__).resolve().parents[2]
PROVENANCE = ("run_id", "playbook", "inventory", "target", "seed", "git_commit", "status")


@pytest.fixture
def results(two_runs, tmp_path) -> Path:
    """A copy of the two runs' results folder, the second run tagged fig3."""
    results = tmp_path / "results"
    shutil.copytree(two_runs[0], results)
    assert main(["runs", "tag", two_runs[2].name, "fig3", "--results", str(results)]) == 0
    return results


def expected_rows(results: Path, spans: str | None = None, **filters) -> list[tuple]:
    """The catalog's own answer: (run, trial, step, span, ms) of every sample, with its run's provenance."""
    runs = {r["folder"]: r for r in select_runs(results, **filters)}
    out = []
    for s in span_samples(results, spans, **filters):
        run = runs[s["folder"]]
        out.append((*(run[k] for k in PROVENANCE), s["trial"], s["step"], s["span"], s["ms"]))
    return out


def csv_rows(path: Path) -> list[dict]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def as_catalog_row(row: dict) -> tuple:
    """A CSV row's text as the catalog's values (the seed and trial integers, ms the float written)."""
    values = [int(row[k]) if k == "seed" else row[k] for k in PROVENANCE]
    return (*values, int(row["trial"]), row["step"], row["span"], float(row["ms"]))


def test_csv_export_is_every_sample_with_its_run(results, tmp_path, capsys):
    out = tmp_path / "fig.csv"
    assert main(["export", "--results", str(results), "--format", "csv", "--out", str(out)]) == 0
    said = capsys.readouterr().err
    rows = csv_rows(out)
    expected = expected_rows(results)
    assert len(expected) == 2 * 2 * 3 * 3  # two runs, two trials, three configurations, three spans
    assert [as_catalog_row(r) for r in rows] == expected  # every float read back is the number indexed
    assert f"wrote {out}: {len(expected)} samples" in said
    runs = select_runs(results)
    for row in rows:
        assert row["protocols"] == "polatis-scpi" and row["switches"] == "ocs1=polatis-scpi"
        assert row["sweep"] == "{}" and row["git_dirty"] in ("true", "false")
        assert row["tags"] == ("fig3" if row["run_id"] == runs[1]["run_id"] else "")
        assert row["started"] == next(r["started"] for r in runs if r["run_id"] == row["run_id"])
    # The runs beside the samples, one row each, with what a run has and a sample does not.
    listed = csv_rows(tmp_path / "fig.runs.csv")
    assert [r["run_id"] for r in listed] == [r["run_id"] for r in runs]
    assert [int(r["trials_ok"]) for r in listed] == [2, 2] and [r["seed"] for r in listed] == ["0", "7"]
    assert listed[1]["tags"] == "fig3" and listed[0]["playbook_file"].endswith("ocs-reconfig.yaml")


def test_parquet_export_reads_back_typed(results, tmp_path):
    out = tmp_path / "fig.parquet"
    argv = ["export", "--results", str(results), "--format", "parquet", "--out", str(out), "--span", "reconfig.total"]
    assert main(argv) == 0
    table = pq.read_table(out)
    assert str(table.schema.field("ms").type) == "double" and str(table.schema.field("seed").type) == "int64"
    assert str(table.schema.field("started").type) == "timestamp[us, tz=UTC]"
    got = [tuple(row[k] for k in (*PROVENANCE, "trial", "step", "span", "ms")) for row in table.to_pylist()]
    assert got == expected_rows(results, spans="reconfig.total")
    assert len(got) == 2 * 2 * 3
    started = {r["run_id"]: r["started"] for r in select_runs(results)}
    assert all(row["started"].isoformat() == started[row["run_id"]] for row in table.to_pylist())
    runs = pq.read_table(tmp_path / "fig.runs.parquet").to_pylist()
    assert [r["seed"] for r in runs] == [0, 7] and [r["trials_planned"] for r in runs] == [2, 2]


def test_the_selection_filters_and_stdout(results, tmp_path, capsys):
    capsys.readouterr()
    assert main(["export", "--results", str(results), "--tag", "fig3", "--out", "-"]) == 0
    captured = capsys.readouterr()
    out = tmp_path / "stdout.csv"
    out.write_text(captured.out)
    rows = csv_rows(out)
    assert [as_catalog_row(r) for r in rows] == expected_rows(results, tag="fig3")
    assert {r["seed"] for r in rows} == {"7"} and captured.err == ""
    out = tmp_path / "by-seed.csv"
    assert main(["export", "--results", str(results), "--twin", "--protocol", "polatis-scpi", "--out", str(out)]) == 0
    assert len(csv_rows(out)) == len(expected_rows(results))


def test_mistakes_are_said_without_a_traceback(results, tmp_path, capsys):
    capsys.readouterr()
    assert main(["export", "--results", str(results), "--lab", "--out", str(tmp_path / "x.csv")]) == 2
    assert "no run matches" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()
    assert main(["export", "--results", str(results), "--out", str(tmp_path / "nowhere" / "x.csv")]) == 2
    assert "no folder" in capsys.readouterr().err
    assert main(["export", "--results", str(results), "--format", "parquet", "--out", "-"]) == 2
    assert "only CSV goes to standard output" in capsys.readouterr().err


def test_parquet_without_pyarrow_says_what_to_install(results, tmp_path):
    # pyarrow made unimportable in a fresh interpreter, as on a control host without the analysis extra.
    probe = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "from testbed.cli.main import main\n"
        f"sys.exit(main(['export', '--results', {str(results)!r}, '--format', 'parquet', '--out', "
        f"{str(tmp_path / 'x.parquet')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'testbed[analysis]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_a_sweep_point_is_a_column_per_key(testbed_run, repo, tmp_path):
    # ocs-reconfig swept over two keys its steps do not use: one of numbers, one mixing text and a number.
    text = (repo / "playbooks/ocs-reconfig.yaml").read_text()
    playbook = tmp_path / "swept.yaml"
    playbook.write_text(text.replace("\nseed: 0\n", '\nseed: 0\nsweep:\n  power: [1, 2]\n  label: ["a", 3]\n', 1))
    results = tmp_path / "results"
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    testbed_run(str(playbook), "--emulate", "--inventory", inventory, "--trials", "1", "--results", str(results))
    samples = span_samples(results, "reconfig.total")
    points = {(s["sweep"]["power"], s["sweep"]["label"]) for s in samples}
    assert points == {(1, "a"), (1, 3), (2, "a"), (2, 3)}
    out = tmp_path / "swept.parquet"
    argv = ["export", "--results", str(results), "--format", "parquet", "--out", str(out), "--span", "reconfig.total"]
    assert main(argv) == 0
    table = pq.read_table(out)
    assert str(table.schema.field("sweep.power").type) == "int64"
    assert table.column("sweep.power").to_pylist() == [s["sweep"]["power"] for s in samples]
    # A key whose values mix types is JSON text, as in the sweep column.
    assert table.column("sweep.label").to_pylist() == [json.dumps(s["sweep"]["label"]) for s in samples]
    assert [json.loads(v) for v in table.column("sweep").to_pylist()] == [s["sweep"] for s in samples]
    out = tmp_path / "swept.csv"
    assert main(["export", "--results", str(results), "--out", str(out), "--span", "reconfig.total"]) == 0
    rows = csv_rows(out)
    assert [(int(r["sweep.power"]), r["sweep.label"]) for r in rows] == [
        (s["sweep"]["power"], str(s["sweep"]["label"])) for s in samples
    ]
