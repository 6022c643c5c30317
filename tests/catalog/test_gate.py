"""`testbed gate` on real twin runs: a deliberate slowdown of the OCS's switching time (an inventory copy with a larger
`emulation.switching_time_ms`) exits 1, an unchanged rerun exits 0, and the numbers printed are the samples' own.
The selection syntax is fuzzed: anything a user types is filters or a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from campaign_runs import CAMPAIGN_TIMEOUT_S, campaign, folder_samples
from hypothesis import given
from hypothesis import strategies as st

from testbed.catalog import select_runs
from testbed.catalog.gate import KEYS, parse_selection
from testbed.cli.main import main
from testbed.contracts.errors import UserError
from testbed.results.stats import median_ratio_interval

# The first test to ask for the session's campaign (nine twin runs) pays for it within its own time bound: on a
# machine busy with other work that is minutes, past the suite's 120 s default (tests/catalog/campaign_runs.py).
pytestmark = pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)

SPANS = ("reconfig.total", "reconfig.ack")


@pytest.fixture(scope="session")
def results(repo, tmp_path_factory) -> Path:
    return campaign(repo, tmp_path_factory.mktemp("campaign"))


def samples(results: Path, tag: str, span: str) -> list[np.ndarray]:
    return [np.array(folder_samples(Path(r["path"]), span)) for r in select_runs(results, tag=tag)]


def gate(capsys, results: Path, candidate: str, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(
        ["gate", *SPANS, "--baseline", "tag=baseline", "--candidate", candidate, "--results", str(results), *extra]
    )
    return code, capsys.readouterr().out


def test_a_slower_switch_fails_the_gate_with_the_samples_numbers(results, capsys):
    code, out = gate(capsys, results, "tag=slow,twin")
    assert code == 1, out
    assert "gate: FAIL" in out
    for span in SPANS:
        base, slow = samples(results, "baseline", span), samples(results, "slow", span)
        expected = median_ratio_interval(base, slow)  # the folders' samples, not the catalog's
        assert expected["unit"] == {"baseline": "runs", "candidate": "runs"}
        assert f"{np.median(np.concatenate(base)):.4f}" in out and f"{np.median(np.concatenate(slow)):.4f}" in out
        low, high = expected["interval"]
        assert f"{expected['ratio']:.4f} [{low:.4f}-{high:.4f}]" in out
        assert low > 1.05  # 25 -> 75 ms of switching: far beyond noise
    code, printed = gate(capsys, results, "tag=slow", "--json")
    assert code == 1 and json.loads(printed)["failed"] == list(SPANS)


def test_an_unchanged_rerun_passes(results, capsys):
    code, out = gate(capsys, results, "tag=rerun")
    assert code == 0, out
    assert "gate: pass" in out
    result = json.loads(gate(capsys, results, "tag=rerun", "--json")[1])
    assert [c["span"] for c in result["comparisons"]] == list(SPANS)  # no sweep: one comparison a span
    assert result["correction"] == "Holm-Bonferroni" and result["failed_points"] == []
    for span, s in zip(SPANS, result["comparisons"], strict=True):
        # never slower; "cannot tell" when the load on the machine moved between the runs is a pass too
        assert s["point"] == {} and result["spans"][span]["verdict"] in ("ok", "cannot tell")
        assert s["verdict"] in ("ok", "cannot tell")
        assert s["baseline_n"] == s["candidate_n"] == 3 * 10 * 3  # 3 runs, 10 trials, 3 steps
        assert (
            s["interval"]
            == median_ratio_interval(samples(results, "baseline", span), samples(results, "rerun", span))["interval"]
        )
    # A tolerance the slowdown is within passes too: it is the tolerance, not the noise, that fails it.
    assert gate(capsys, results, "tag=slow", "--max-slowdown", "1000")[0] == 0


def test_fewer_than_three_runs_are_resampled_by_samples_with_a_warning(results, capsys):
    first = select_runs(results, tag="rerun")[0]["run_id"]
    capsys.readouterr()
    code = main(
        [
            "gate",
            "reconfig.total",
            "--baseline",
            "tag=baseline",
            "--candidate",
            f"run={first}",
            "--results",
            str(results),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0 and "the candidate has 1 run(s), fewer than 3: resampled by samples" in captured.err


def test_mistakes_are_clear_errors(results, capsys):
    cases = [
        (["--candidate", "tag=rerun"], "baseline"),  # argparse: the required option
        (["--baseline", "colour=red", "--candidate", "tag=rerun"], "--baseline 'colour=red': unknown key 'colour'"),
        (["--baseline", "tag=baseline", "--candidate", "rerun"], "--candidate 'rerun': give KEY=VALUE"),
        (["--baseline", "tag=baseline", "--candidate", "tag=nosuch"], "the candidate (tag=nosuch) has no run"),
        (["--baseline", "tag=baseline", "--candidate", "tag=baseline"], "share 3 run(s)"),
        (
            ["--baseline", "tag=baseline", "--candidate", "tag=rerun", "--max-slowdown", "-1"],
            "a percentage of 0 or more",
        ),
    ]
    for args, said in cases:
        capsys.readouterr()
        try:
            code = main(["gate", "reconfig.total", *args, "--results", str(results)])
        except SystemExit as exc:  # argparse's own usage error
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err, (args, err)


def test_selection_items_read_as_filters():
    assert parse_selection(["tag=a,twin", "tag=b", " commit = 3f2a "]) == {
        "tag": ["a", "b"],
        "target": "twin",
        "commit": "3f2a",
    }
    with pytest.raises(UserError, match="commit given twice"):
        parse_selection(["commit=1,commit=2"])
    with pytest.raises(UserError, match="select some runs"):
        parse_selection([" , "])


@given(st.lists(st.text(max_size=30), max_size=4))
def test_any_selection_text_is_filters_or_a_user_error(items):
    try:
        filters = parse_selection(items)
    except UserError as exc:
        assert "--baseline" in str(exc)
        return
    assert filters and set(filters) <= set(KEYS)
    assert all(v for v in filters.values())


@given(
    st.dictionaries(
        st.sampled_from([k for k in KEYS if k != "tag"]), st.from_regex(r"[A-Za-z0-9_.:-]{1,12}", fullmatch=True)
    )
)
def test_written_filters_read_back(filters):
    if not filters:
        return
    assert parse_selection([",".join(f"{k}={v}" for k, v in filters.items())]) == filters
