"""`testbed trend SPAN [SELECTION]` on real twin runs: run by run the rows are each run's own summary, oldest first;
commit by commit each commit's runs pooled; the plot is a PNG that decodes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from campaign_runs import campaign, folder_samples
from catalog_copies import copy_run
from matplotlib.image import imread

from testbed.catalog import select_runs
from testbed.cli.main import main
from testbed.results.stats import summarize

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
