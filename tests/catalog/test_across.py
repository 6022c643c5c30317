"""`testbed report --across SELECTION` on real twin runs: each run's row is its own summary's, the pooled spans are
every sample's, the CDF overlay is a PNG that decodes, and the HTML page embeds it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from campaign_runs import CAMPAIGN_TIMEOUT_S, campaign, folder_samples
from matplotlib.image import imread

from testbed.catalog import select_runs, span_columns, span_samples
from testbed.cli.main import main
from testbed.results.stats import summarize

# The first test to ask for the session's campaign (nine twin runs) pays for it within its own time bound: on a
# machine busy with other work that is minutes, past the suite's 120 s default (tests/catalog/campaign_runs.py).
pytestmark = pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)


@pytest.fixture(scope="session")
def results(repo, tmp_path_factory) -> Path:
    return campaign(repo, tmp_path_factory.mktemp("campaign"))


def test_each_runs_row_is_its_summary_and_the_pool_is_every_sample(results, capsys):
    capsys.readouterr()
    assert main(["report", "--across", "--results", str(results), "--tag", "baseline", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    baseline = select_runs(results, tag="baseline")
    assert [r["run_id"] for r in got["runs"]] == [r["run_id"] for r in baseline] and len(baseline) == 3
    for row, run in zip(got["runs"], baseline, strict=True):
        summary = json.loads((Path(run["path"]) / "summary.json").read_text())
        assert row["stats"] == summary["spans"]  # n, p50, its CI, p90, p99, max: the run's own numbers
    for span, pooled in got["pooled"].items():
        every = [x for run in baseline for x in folder_samples(Path(run["path"]), span)]
        assert pooled == summarize(every)


def test_the_tables_the_cdf_overlay_and_the_html_page(results, tmp_path, capsys):
    capsys.readouterr()
    html = tmp_path / "fig3.html"
    args = ["report", "--across", "--results", str(results), "--tag", "slow", "--span", "reconfig.total"]
    assert main([*args, "--out", str(tmp_path), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    slow = select_runs(results, tag="slow")
    for run in slow:
        s = summarize(folder_samples(Path(run["path"]), "reconfig.total"))
        assert run["run_id"] in out and f"{s['p50_ms']:.4f}" in out
        assert f"{s['p50_ci95_ms'][0]:.4f}-{s['p50_ci95_ms'][1]:.4f}" in out
    assert "pooled: every sample of the 3 runs" in out
    png = tmp_path / "across_cdf_reconfig.total.png"
    assert f"wrote {png}" in out and f"wrote {html}" in out
    assert imread(png).shape[0] > 100  # a PNG that decodes, of a figure's size
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 1 and all(r["run_id"] in page for r in slow)


def test_span_columns_hold_the_samples_span_samples_lists(results):
    columns = span_columns(results, ["reconfig.total", "reconfig.ack"], tag="rerun")
    rows = span_samples(results, ["reconfig.total", "reconfig.ack"], tag="rerun")
    assert [c["run_id"] for c in columns] == list(dict.fromkeys(r["run_id"] for r in rows))
    for c in columns:
        for span in ("reconfig.total", "reconfig.ack"):
            mine = [(r["trial"], r["ms"]) for r in rows if r["run_id"] == c["run_id"] and r["span"] == span]
            trials, ms = c["trials"][span].astype(int).tolist(), c["spans"][span].tolist()
            assert sorted(mine) == list(zip(trials, ms, strict=True))
            assert np.array_equal(np.sort(c["spans"][span]), np.sort(folder_samples(Path(c["path"]), span)))


def test_an_empty_selection_or_no_run_is_a_clear_error(results, capsys):
    capsys.readouterr()
    assert main(["report", "--across", "--results", str(results), "--tag", "nosuchtag"]) == 2
    err = capsys.readouterr().err
    assert "no run selected by tag=nosuchtag" in err and "Traceback" not in err
    assert main(["report"]) == 2
    assert "give a run folder, or --across" in capsys.readouterr().err
    assert main(["report", str(results), "--across", "--results", str(results)]) == 2
    assert "not both" in capsys.readouterr().err
