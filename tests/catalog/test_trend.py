"""`testbed trend SPAN [SELECTION]` on real twin runs: run by run the rows are each run's own summary, oldest first;
commit by commit each commit's runs pooled; the plot is a PNG that decodes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from campaign_runs import CAMPAIGN_TIMEOUT_S, campaign, folder_samples
from catalog_copies import copy_run
from matplotlib.image import imread

from testbed.catalog import select_runs
from testbed.cli.main import main
from testbed.results.stats import summarize

# The first test to ask for the session's campaign (nine twin runs) pays for it within its own time bound: on a
# machine busy with other work that is minutes, past the suite's 120 s default (tests/catalog/campaign_runs.py).
pytestmark = pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)

SPAN = "reconfig.total"


@pytest.fixture(scope="session")
def results(repo, tmp_path_factory) -> Path:
    return campaign(repo, tmp_path_factory.mktemp("campaign"))


def trend_json(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert main(["trend", SPAN, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_run_by_run_each_row_is_the_runs_summary_oldest_first(results, tmp_path, capsys):
    runs = select_runs(results)
    rows = trend_json(capsys, "--results", str(results))
    assert [r["runs"] for r in rows] == [[run["run_id"]] for run in runs] and len(rows) == 9
    assert [r["started"] for r in rows] == sorted(r["started"] for r in rows)
    for row, run in zip(rows, runs, strict=True):
        summary = json.loads((Path(run["path"]) / "summary.json").read_text())["spans"][SPAN]
        assert {k: row[k] for k in summary} == summary
    capsys.readouterr()
    assert main(["trend", SPAN, "--results", str(results), "--tag", "slow", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for run in select_runs(results, tag="slow"):
        s = summarize(folder_samples(Path(run["path"]), SPAN))
        assert run["run_id"] in out and f"{s['p50_ms']:.4f}" in out
    png = tmp_path / f"trend_{SPAN}_by_date.png"
    assert f"wrote {png}" in out and imread(png).shape[0] > 100


def test_commit_by_commit_pools_each_commits_runs(results, tmp_path, capsys, monkeypatch):
    mine = tmp_path / "results"
    mine.mkdir()
    runs = select_runs(results, tag="baseline")
    commits = ["a" * 40, "a" * 40, "b" * 40]  # two runs of one commit, then one of the next
    for i, (run, commit) in enumerate(zip(runs, commits, strict=True)):
        copy = copy_run(Path(run["path"]), mine, i, started_offset_s=3600.0 * i)
        info = json.loads((copy / "run.json").read_text())
        info["git_revision"] = commit
        (copy / "run.json").write_text(json.dumps(info))
    rows = trend_json(capsys, "--results", str(mine), "--by", "commit")
    assert [(r["label"], len(r["runs"])) for r in rows] == [("a" * 10, 2), ("b" * 10, 1)]
    first_two = [x for run in runs[:2] for x in folder_samples(Path(run["path"]), SPAN)]
    assert {k: rows[0][k] for k in summarize(first_two)} == summarize(first_two)
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # the figure goes where the user is, not among the run folders
    assert main(["trend", SPAN, "--results", str(mine), "--by", "commit"]) == 0
    out = capsys.readouterr().out
    assert "commit by commit" in out and "aaaaaaaaaa" in out and "bbbbbbbbbb" in out
    assert imread(tmp_path / f"trend_{SPAN}_by_commit.png").shape[0] > 100
    assert all(p.is_dir() for p in mine.iterdir())  # the results folder holds run folders only
    shutil.rmtree(mine)


def test_a_span_no_run_measured_is_a_clear_error(results, capsys):
    capsys.readouterr()
    assert main(["trend", "failover.total", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert "no run in the results folders measured 'failover.total'" in err and "Traceback" not in err


def steady_history(results: Path, mine: Path) -> tuple[list[Path], list[Path]]:
    """Nine runs in `mine` as a machine with nothing else to do would make them: six at the 25 ms switch's level,
    then three at the 75 ms switch's, each level the copies of one real run of the campaign (its first baseline run,
    its first slow run), a minute apart. The campaign's own runs carry whatever other work on the machine did
    between them, and on a busy machine that work can step too: a real step, which the trend rightly finds, and not
    what these tests are about.
    """
    base, slow = select_runs(results, tag="baseline")[0], select_runs(results, tag="slow")[0]
    before = [copy_run(Path(base["path"]), mine, i, started_offset_s=60.0 * i) for i in range(6)]
    after = [copy_run(Path(slow["path"]), mine, i, started_offset_s=60.0 * i) for i in range(6, 9)]
    return before, after  # the slow run started after the baseline one: the copies' order is the list's


def test_a_step_in_the_history_is_found_between_the_runs_it_happened(results, capsys, tmp_path):
    mine = tmp_path / "results"
    mine.mkdir()
    before, after = steady_history(results, mine)
    rows = trend_json(capsys, "--results", str(mine))
    assert [r["label"] for r in rows] == [p.name for p in before + after]
    stepped = [r for r in rows if r["step"]]
    assert [r["label"] for r in stepped] == [after[0].name], [(r["label"], r["p50_ms"]) for r in rows]
    (step,) = stepped
    assert step["step"]["after"] == before[-1].name
    low, high = step["step"]["interval"]
    assert 1.05 < low <= step["step"]["ratio"] <= high
    capsys.readouterr()
    assert main(["trend", SPAN, "--results", str(mine), "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"between {before[-1].name} and {after[0].name}" in out and "binary segmentation" in out
    rows = trend_json(capsys, "--results", str(results), "--tag", "baseline")
    assert not any(r["step"] for r in rows)  # three runs of one switch: too few for a level on each side


def test_gate_against_the_trend_compares_with_the_level_since_the_last_step(results, tmp_path, capsys):
    # A steady history of nine runs, and a tenth: a copy of the first slow run, newer than every other. Against the
    # baseline tag it is slower; against the trend, the level since the step is the slow runs' own, and it is not.
    mine = tmp_path / "results"
    mine.mkdir()
    _, after = steady_history(results, mine)
    newest = copy_run(Path(select_runs(results, tag="slow")[0]["path"]), mine, 99, started_offset_s=3600.0)
    argv = ["gate", SPAN, "--candidate", f"run={newest.name}", "--results", str(mine), "--max-slowdown", "20"]
    capsys.readouterr()
    assert main([*argv, "--baseline", "tag=baseline"]) == 1
    capsys.readouterr()
    assert main([*argv, "--against-trend", "--json"]) == 0
    (c,) = json.loads(capsys.readouterr().out)["comparisons"]
    slow_copies = [p.name for p in after]
    assert c["baseline_runs"] == slow_copies and c["baseline_since"] == {"run": slow_copies[0], "steps": 1}
    assert c["candidate_runs"] == [newest.name] and c["verdict"] != "slower"
    assert main([*argv, "--against-trend"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{SPAN}: 1 step(s) in its history; the baseline is its runs since {slow_copies[0]}" in out
    capsys.readouterr()
    assert main(["gate", SPAN, "--candidate", "tag=baseline", "--results", str(mine)]) == 2
    assert "--baseline KEY=VALUE (e.g. tag=before), or --against-trend" in capsys.readouterr().err


def test_by_param_pools_each_value_in_numeric_order(results, tmp_path, capsys):
    from testbed.catalog.annotations import add_param

    mine = tmp_path / "results"
    mine.mkdir()
    slow, fast = select_runs(results, tag="slow"), select_runs(results, tag="baseline")
    for i, (run, ms, offset) in enumerate([(r, "75", -7200.0) for r in slow] + [(r, "25", 0.0) for r in fast]):
        add_param(copy_run(Path(run["path"]), mine, i, started_offset_s=offset), "switch_ms", ms)  # 75 met first
    rows = trend_json(capsys, "--results", str(mine), "--by", "param:switch_ms")
    assert [(r["label"], len(r["runs"])) for r in rows] == [("25", 3), ("75", 3)] and not any(r["step"] for r in rows)
    every = [x for run in fast for x in folder_samples(Path(run["path"]), SPAN)]
    assert {k: rows[0][k] for k in summarize(every)} == summarize(every)
    capsys.readouterr()
    assert main(["trend", SPAN, "--results", str(mine), "--by", "param:switch"]) == 2
    err = capsys.readouterr().err
    assert "no selected run has the param 'switch'; did you mean 'switch_ms'?" in err and "Traceback" not in err
