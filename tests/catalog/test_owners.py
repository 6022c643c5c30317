"""Whose runs a verdict counts: another account drops run folders into a shared results folder (1777, as /var/tmp
is), copies of real slower runs tagged as the user's candidate. gate, trend and report --across count only the
invoking user's folders (the kernel's owner, not run.json's `user`), so the planted runs change no verdict; `runs`
shows each folder's owner; `owner=` / `--owner` counts another's runs when the user asks for them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from accounts import MALLORY, as_account, needs_root, shared_folder
from campaign_runs import CAMPAIGN_TIMEOUT_S, campaign

from testbed.catalog import add_tag, select_runs
from testbed.cli.main import main

SPANS = ("reconfig.total", "reconfig.ack")
PLANTED_COPIES = 5  # of each of the three slow runs: so many that a resampling of the runs keeps them the median
pytestmark = [needs_root, pytest.mark.timeout(CAMPAIGN_TIMEOUT_S)]  # its folder is a campaign's (campaign_runs.py)


@pytest.fixture(scope="module")
def shared(repo, tmp_path_factory) -> Path:
    """A shared results folder: the user's baseline and rerun runs, and mallory's copies of the slow runs, several
    of each, which mallory tagged `rerun`: counted, they outnumber the user's reruns and fail the gate.
    """
    made = campaign(repo, tmp_path_factory.mktemp("campaign"))
    results = shared_folder() / "results"
    results.mkdir(mode=0o1777)
    results.chmod(0o1777)
    for run in select_runs(made, tag="baseline") + select_runs(made, tag="rerun"):
        shutil.copytree(run["path"], results / run["folder"])
    staging = results.parent / "staging"  # where mallory can read the slow runs (pytest's tmp is root's alone)
    slow = [shutil.copytree(run["path"], staging / run["folder"]) for run in select_runs(made, tag="slow")]

    def plant() -> None:
        for i, path in enumerate(slow * PLANTED_COPIES):
            copy = results / f"{Path(path).name}-copy{i}"  # a folder of mallory's among the user's
            shutil.copytree(path, copy)
            add_tag(copy, "rerun")

    as_account(MALLORY, plant)
    return results


def gate(capsys, results: Path, candidate: str) -> tuple[int, dict]:
    capsys.readouterr()
    argv = ["gate", *SPANS, "--baseline", "tag=baseline", "--candidate", candidate, "--results", str(results)]
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_runs_shows_each_folder_s_owner_as_the_kernel_says(shared, capsys):
    capsys.readouterr()
    assert main(["runs", "--results", str(shared), "--tag", "rerun", "--json"]) == 0
    owners = sorted(r["owner"] for r in json.loads(capsys.readouterr().out))
    planted = [f"uid {MALLORY}"] * 3 * PLANTED_COPIES
    assert owners == ["root"] * 3 + planted  # mallory's copies say root's `user` in run.json
    assert main(["runs", "--results", str(shared), "--owner", str(MALLORY), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3 * PLANTED_COPIES


def test_planted_slower_runs_do_not_change_the_gate_s_verdict(shared, capsys):
    code, result = gate(capsys, shared, "tag=rerun")
    assert code == 0 and result["failed_points"] == []  # the user's three reruns only: 3 runs x 10 trials x 3 steps
    assert [c["candidate_n"] for c in result["comparisons"]] == [90, 90]
    assert all(c["verdict"] in ("ok", "cannot tell") for c in result["comparisons"])
    # counted when the user asks for them: mallory's slower copies outnumber the user's reruns and fail the gate
    code, everyone = gate(capsys, shared, "tag=rerun,owner=anyone")
    assert [c["candidate_n"] for c in everyone["comparisons"]] == [90 * (1 + PLANTED_COPIES)] * 2
    assert code == 1 and all(c["ratio"] > 1.5 for c in everyone["comparisons"]), everyone


def test_trend_counts_the_user_s_runs_unless_told_whose(shared, capsys):
    capsys.readouterr()
    assert main(["trend", "reconfig.ack", "--results", str(shared), "--tag", "rerun", "--json"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert (
        main(["trend", "reconfig.ack", "--results", str(shared), "--tag", "rerun", "--owner", "anyone", "--json"]) == 0
    )
    everyone = json.loads(capsys.readouterr().out)
    counted = sum(len(row["runs"]) for row in mine), sum(len(row["runs"]) for row in everyone)
    assert counted == (3, 3 + 3 * PLANTED_COPIES), (mine, everyone)


def test_an_owner_that_is_no_account_is_a_clear_error(shared, capsys):
    capsys.readouterr()
    assert main(["trend", "reconfig.ack", "--results", str(shared), "--owner", "nosuchuser"]) == 2
    assert "--owner 'nosuchuser': no such account here" in capsys.readouterr().err
