"""Sweeps across runs, on real twin runs: `gate`, `compare`, `trend` and `report --across` compare a sweep point with
the same point, never the points pooled.

The playbook is ocs-reconfig with a sweep (`hold_ms`: a wait before the second reconfiguration, 0 or 5 ms). Three
runs tagged `switch25` and three tagged `rerun` on playbooks/inventory/emulated-rack.yaml, and three tagged
`switch75` on a copy whose OCS switches in 75 ms instead of 25 (a difference no load on the machine blurs): every
point slower, which the gate must say point by point.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from campaign_runs import CAMPAIGN_TIMEOUT_S
from catalog_copies import copy_run
from rich.console import Console

from testbed.catalog import select_runs
from testbed.cli.main import main
from testbed.results.compare import SLOWER, compare_runs
from testbed.results.stats import median_ratio_interval, summarize

# The module's campaign (nine swept twin runs) is made inside the first test's time bound: minutes on a busy machine.
pytestmark = pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)

TRIALS = 3  # per sweep point: 3 trials x 3 reconfigurations = 9 samples of a span per point and run
RUNS_PER_SIDE = 3
SPANS = ("reconfig.ack", "reconfig.total")
POINTS = ({"hold_ms": 0}, {"hold_ms": 5})


@pytest.fixture(scope="module")
def results(repo, tmp_path_factory) -> Path:
    import testbed
    from testbed.catalog import add_tag

    root = tmp_path_factory.mktemp("sweeps")
    text = (repo / "playbooks/ocs-reconfig.yaml").read_text()
    swept = text.replace("\nseed: 0\n", "\nseed: 0\nsweep:\n  hold_ms: [0, 5]\n", 1)
    second = "  - {action: fabric.apply, configuration: east-west, measure: reconfig}\n"
    assert swept != text and second in swept
    playbook = root / "ocs-reconfig-swept.yaml"
    playbook.write_text(swept.replace(second, '  - {action: wait, ms: "${hold_ms}"}\n' + second))
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    inventory_text = inventory.read_text()
    assert "switching_time_ms: 25," in inventory_text
    slow = root / "emulated-rack-75ms.yaml"
    slow.write_text(inventory_text.replace("switching_time_ms: 25,", "switching_time_ms: 75,"))
    results = root / "results"
    quiet = Console(quiet=True)
    for file, tags in ((inventory, ("switch25", "rerun")), (slow, ("switch75",))):
        with testbed.Lab(file, emulate=True, results=results, console=quiet) as lab:
            for tag in tags:
                for _ in range(RUNS_PER_SIDE):
                    run = lab.run(playbook, trials=TRIALS)
                    assert run.ok, run.error
                    add_tag(run.folder, tag)
    return results


def point_samples(run_dir: Path, span: str, point: dict) -> np.ndarray:
    """A run's samples of `span` at one sweep point, as its own folder has them (trials.csv)."""
    with open(run_dir / "trials.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["span"] == span and json.loads(r["sweep"]) == point]
    return np.array([float(r["duration_ms"]) for r in rows])


def runs_at(results: Path, tag: str, span: str, point: dict) -> list[np.ndarray]:
    return [point_samples(Path(r["path"]), span, point) for r in select_runs(results, tag=tag)]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def gate(capsys, results: Path, candidate: str, *extra: str) -> tuple[int, str, str]:
    return cli(
        capsys,
        "gate",
        *SPANS,
        "--baseline",
        "tag=switch25",
        "--candidate",
        candidate,
        "--results",
        str(results),
        *extra,
    )


def test_a_slower_switch_fails_the_gate_at_every_sweep_point_named(results, capsys):
    code, out, _ = gate(capsys, results, "tag=switch75")
    assert code == 1, out
    fail = next(line for line in out.splitlines() if line.startswith("gate: FAIL"))
    assert "4 of 4 comparisons" in fail
    for span in SPANS:
        for point in POINTS:
            assert f"{span} @ hold_ms={point['hold_ms']}" in fail
    assert "Holm-Bonferroni" in out
    code, printed, _ = gate(capsys, results, "tag=switch75", "--json")
    result = json.loads(printed)
    assert code == 1 and result["failed"] == list(SPANS) and result["correction"] == "Holm-Bonferroni"
    assert [(c["span"], c["point"]) for c in result["comparisons"]] == [(s, p) for s in SPANS for p in POINTS]
    for c in result["comparisons"]:
        # Each point's numbers are those of that point's samples in the folders, and nothing else.
        base = runs_at(results, "switch25", c["span"], c["point"])
        slow = runs_at(results, "switch75", c["span"], c["point"])
        assert c["baseline_n"] == c["candidate_n"] == RUNS_PER_SIDE * TRIALS * 3
        expected = median_ratio_interval(base, slow, resamples=c["resamples"], limit=result["limit"])
        assert c["ratio"] == expected["ratio"] and c["interval"] == expected["interval"]
        low, high = c["interval"]
        assert f"{c['ratio']:.4f} [{low:.4f}-{high:.4f}]" in out  # each point's ratio and interval, printed
        assert c["verdict"] == "slower" and c["p_holm"] <= result["alpha"] and low > 1.05


def test_an_unchanged_rerun_passes_point_by_point(results, capsys):
    code, out, _ = gate(capsys, results, "tag=rerun")
    assert code == 0, out
    assert "gate: pass: none of 4 comparisons (span x sweep point)" in out
    result = json.loads(gate(capsys, results, "tag=rerun", "--json")[1])
    assert result["failed"] == [] and {c["verdict"] for c in result["comparisons"]} <= {"ok", "cannot tell"}


def test_sweep_selects_points_and_names_the_variables(results, capsys):
    result = json.loads(gate(capsys, results, "tag=switch75", "--sweep", "hold_ms=5", "--json")[1])
    assert [c["point"] for c in result["comparisons"]] == [{"hold_ms": 5}, {"hold_ms": 5}]
    code, _, err = gate(capsys, results, "tag=switch75", "--sweep", "hold=5")
    assert code == 2 and "did you mean 'hold_ms'?" in err and "sweep variables: hold_ms" in err
    code, _, err = gate(capsys, results, "tag=switch75", "--sweep", "hold_ms=7")
    assert code == 2 and "selects none of the sweep points measured: hold_ms=0; hold_ms=5" in err
    code, _, err = gate(capsys, results, "tag=switch75", "--sweep", "hold_ms")
    assert code == 2 and "--sweep 'hold_ms': give KEY=VALUE" in err and "Traceback" not in err


def test_compare_shows_each_points_difference(results):
    base = Path(select_runs(results, tag="switch25")[0]["path"])
    slow = Path(select_runs(results, tag="switch75")[0]["path"])
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(compare_runs(base, slow))
    text = console.export_text()
    assert "sweep point by sweep point" in text
    # The two inventories share a name; what differs in them is said, and the catalog tells them apart.
    assert "inventory.devices.ocs1.emulation.switching_time_ms: 25.0 -> 75.0" in text
    (fast,), (slow_run,) = (select_runs(results, run=p.name) for p in (base, slow))
    assert fast["inventory"] == slow_run["inventory"] and fast["inventory_digest"] != slow_run["inventory_digest"]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    ack = {}
    for i, row in enumerate(rows):
        if row[0] == "reconfig.ack":
            ack[row[1]] = (row, rows[i + 1])
    assert sorted(ack) == ["hold_ms=0", "hold_ms=5"]
    for label, (a, b) in ack.items():
        point = {"hold_ms": int(label.split("=")[1])}
        assert a[2] == "A" and b[2] == "B" and a[3] == b[3] == str(TRIALS * 3)  # the point's samples, not all
        assert a[7] == SLOWER
        ratio = np.median(point_samples(slow, "reconfig.ack", point)) / np.median(
            point_samples(base, "reconfig.ack", point)
        )
        assert a[6] == f"{ratio:.2f}"


def test_trend_by_tag_draws_a_series_per_point(results, capsys, tmp_path):
    code, out, _ = cli(capsys, "trend", "reconfig.ack", "--results", str(results), "--by", "tag", "--json")
    rows = json.loads(out)
    assert [(r["series"], r["label"]) for r in rows] == [
        (f"hold_ms={p['hold_ms']}", tag) for p in POINTS for tag in ("switch25", "rerun", "switch75")
    ]
    for r in rows:
        every = np.concatenate(runs_at(results, r["label"], "reconfig.ack", r["point"]))
        assert {k: r[k] for k in summarize(every)} == summarize(every) and r["statuses"] == ["ok"] * 3
    code, out, _ = cli(
        capsys, "trend", "reconfig.ack", "--results", str(results), "--by", "tag", "--out", str(tmp_path)
    )
    assert code == 0 and "one series per sweep point (2)" in out
    assert (tmp_path / "trend_reconfig.ack_by_tag.png").stat().st_size > 1000


def test_report_across_pools_a_point_with_itself_only(results, capsys):
    code, out, _ = cli(capsys, "report", "--across", "--results", str(results), "--tag", "switch75", "--json")
    got = json.loads(out)
    assert code == 0 and "reconfig.ack" not in got["pooled"]  # two points: no pool of both
    groups = got["groups"]["reconfig.ack"]
    assert [g["point"] for g in groups] == list(POINTS)
    for g in groups:
        every = np.concatenate(runs_at(results, "switch75", "reconfig.ack", g["point"]))
        assert {k: g[k] for k in summarize(every)} == summarize(every)
    for run in got["runs"]:
        assert [p["label"] for p in run["points"]["reconfig.ack"]] == ["hold_ms=0", "hold_ms=5"]
        assert run["tags"] == ["switch75"]


def test_a_selection_of_two_playbooks_is_split_or_refused_never_pooled(results, tmp_path, capsys):
    mixed = tmp_path / "results"
    mixed.mkdir()
    first, second = (Path(r["path"]) for r in select_runs(results, tag="switch25")[:2])
    copy_run(first, mixed, 0)
    other = copy_run(second, mixed, 1, started_offset_s=60.0)
    info = json.loads((other / "run.json").read_text())
    info["playbook"]["name"] = "other"  # the same spans and points, of another experiment
    (other / "run.json").write_text(json.dumps(info))
    code, out, _ = cli(capsys, "trend", "reconfig.ack", "--results", str(mixed), "--json")
    assert code == 0
    assert [r["series"] for r in json.loads(out)] == [
        "ocs-reconfig hold_ms=0", "ocs-reconfig hold_ms=5", "other hold_ms=0", "other hold_ms=5"
    ]  # fmt: skip
    code, _, err = cli(
        capsys, "gate", "reconfig.ack", "--baseline", "playbook=ocs-reconfig", "--candidate", "playbook=other",
        "--results", str(mixed),
    )  # fmt: skip
    assert code == 2 and "no playbook and sweep point in common" in err and "Traceback" not in err
