"""`testbed gate --webhook URL` on real twin runs: a gate that FAILs POSTs what failed with its figures (and still
exits 1 when the receiver answers 500, the failure logged with the URL redacted); a gate that passes calls nothing.

The runs: ocs-reconfig on playbooks/inventory/emulated-rack.yaml, tagged `baseline` and `rerun`, and on a copy whose
OCS switches three times slower, tagged `slow` (the deliberate slowdown a gate must catch).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from receivers import Receiver
from rich.console import Console

from testbed.cli.main import main
from testbed.contracts.errors import EXIT_EXPERIMENT_FAILED, EXIT_OK

RUNS_PER_SIDE = 2
TRIALS = 4
SPAN = "reconfig.total"

pytestmark = pytest.mark.timeout(900)  # six twin runs on a busy 2-core machine


@pytest.fixture(scope="module")
def results(repo, tmp_path_factory) -> Path:
    import testbed
    from testbed.catalog import add_tag

    root = tmp_path_factory.mktemp("gate-webhook")
    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    assert "switching_time_ms: 25," in text  # the line the slow copy changes
    slow = root / "emulated-rack-slow.yaml"
    slow.write_text(text.replace("switching_time_ms: 25,", "switching_time_ms: 75,"))
    results = root / "results"
    quiet = Console(quiet=True)
    for inventory, tags in (
        (repo / "playbooks/inventory/emulated-rack.yaml", ("baseline", "rerun")),
        (slow, ("slow",)),
    ):
        with testbed.Lab(inventory, emulate=True, results=results, console=quiet) as lab:
            for tag in tags:
                for _ in range(RUNS_PER_SIDE):
                    run = lab.run(repo / "playbooks/ocs-reconfig.yaml", trials=TRIALS)
                    assert run.ok, run.error
                    add_tag(run.folder, tag)
    return results


def gate(results: Path, candidate: str, url: str, *extra: str) -> int:
    options = ["--baseline", "tag=baseline", "--candidate", candidate, "--results", str(results)]
    return main(["gate", SPAN, *options, "--webhook", url, *extra])


def test_a_failing_gate_posts_what_failed_with_its_figures(results, capsys):
    receiver = Receiver()
    try:
        assert gate(results, "tag=slow", receiver.url("/ci/gate")) == EXIT_EXPERIMENT_FAILED
        call = receiver.next_call()
    finally:
        receiver.close()
    body = call["body"]
    assert body["event"] == "gate.failed" and body["failed"] == [SPAN]
    assert body["baseline"] == ["tag=baseline"] and body["candidate"] == ["tag=slow"]
    assert body["max_slowdown_pct"] == 5.0 and body["limit"] == pytest.approx(1.05)
    (slower,) = body["slower"]
    assert slower["span"] == SPAN and slower["ratio"] > 1.05 and slower["interval"][0] > 1.05
    assert slower["candidate_median"] > slower["baseline_median"] and slower["p_holm"] <= 0.025
    assert len(slower["baseline_runs"]) == len(slower["candidate_runs"]) == RUNS_PER_SIDE
    assert "gate: FAIL" in capsys.readouterr().out
    assert receiver.calls.empty()  # one call


def test_a_receiver_that_fails_changes_no_verdict_and_is_logged_redacted(results, capsys):
    receiver = Receiver(500)
    try:
        url = receiver.url("/ci/gate?token=abc123", userinfo="ci:s3cret@")
        assert gate(results, "tag=slow", url, "--json") == EXIT_EXPERIMENT_FAILED
        assert receiver.next_call()["body"]["event"] == "gate.failed"
    finally:
        receiver.close()
    out, err = capsys.readouterr()
    assert '"failed": [' in out  # the JSON verdict, on its own on stdout
    assert (
        f"webhook http://***@127.0.0.1:{receiver.port}/ci/gate?token=***: gate FAIL not delivered: answered 500" in err
    )
    assert "s3cret" not in err + out and "abc123" not in err + out


def test_a_passing_gate_calls_nothing(results, capsys):
    receiver = Receiver()
    try:
        # Twice the baseline tolerated: a rerun of the same lab is never that much slower, whatever the noise.
        assert gate(results, "tag=rerun", receiver.url(), "--max-slowdown", "100") == EXIT_OK
    finally:
        receiver.close()
    assert "gate: pass" in capsys.readouterr().out
    assert receiver.calls.empty()  # the gate waits for its calls before it exits: none was made


def test_gate_refuses_a_webhook_that_is_not_a_url(results, capsys):
    assert gate(results, "tag=slow", "hooks.lab/gate") == 2
    assert "give an http:// or https:// URL" in capsys.readouterr().err
