"""The first playbook end to end through the CLI, against the emulated twin, with the real drivers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.documents import load_inventory

TRIALS = 8


@pytest.fixture(scope="module")
def run(ray_cluster, repo, tmp_path_factory):
    """One emulated run of playbooks/ocs-reconfig.yaml, as a user would start it."""
    results = tmp_path_factory.mktemp("results")
    capture = pytest.MonkeyPatch()
    import io
    import sys

    out = io.StringIO()
    capture.setattr(sys, "stdout", out)
    try:
        code = main(
            [
                "run",
                str(repo / "playbooks/ocs-reconfig.yaml"),
                "--emulate",
                "--trials",
                str(TRIALS),
                "--results",
                str(results),
                "--inventory",
                str(repo / "playbooks/inventory/emulated-rack.yaml"),
            ]
        )
    finally:
        capture.undo()
    text = out.getvalue()
    last = text.strip().splitlines()[-1]
    assert last.startswith("results: "), text
    return code, text, Path(last.removeprefix("results: "))


def test_run_succeeds_and_ends_with_the_results_line(run):
    code, text, run_dir = run
    assert code == 0, text
    assert run_dir.is_dir()
    assert {p.name for p in run_dir.iterdir()} >= {
        "run.json",
        "events.jsonl",
        "audit.jsonl",
        "trials.csv",
        "summary.json",
    }
    assert "reconfig.ack" in text  # the summary table was printed


def test_acknowledge_latency_is_the_switching_time(run, repo):
    _, _, run_dir = run
    ocs = load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model.devices["ocs1"]
    switching = ocs.emulation.switching_time_ms
    with open(run_dir / "trials.csv") as f:
        acks = [float(r["duration_ms"]) for r in csv.DictReader(f) if r["span"] == "reconfig.ack"]
    assert len(acks) == 3 * TRIALS  # three reconfigurations per trial
    # Never earlier than the switch can settle: the acknowledgement really waits for the mirrors (the model's
    # bound: load can only make it later). How close to the switching time it comes (the device actor times it,
    # so a few loopback round trips, never Ray's scheduling) is bench/ocs_overhead.py's figure, on a quiet machine.
    assert min(acks) >= switching - ocs.emulation.jitter_ms, acks


def test_summary_has_every_span_statistic(run):
    _, _, run_dir = run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["trials"] == {"planned": TRIALS, "ok": TRIALS, "failed": 0}
    for span in ("reconfig.ack", "reconfig.light", "reconfig.total"):
        s = summary["spans"][span]
        assert s["n"] == 3 * TRIALS
        assert s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    total, ack = summary["spans"]["reconfig.total"], summary["spans"]["reconfig.ack"]
    assert total["p50_ms"] >= ack["p50_ms"]


def test_events_are_a_closed_history(run):
    _, _, run_dir = run
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    open_ops = 0
    for e in events:
        open_ops += {"invoke": 1, "ok": -1, "fail": -1, "info": -1}.get(e["type"], 0)
    assert open_ops == 0
    assert not [e for e in events if e["type"] in ("fail", "info")]
    ops = [e["op"] for e in events]
    assert ops[0] == "ocs.identify" or ops[0] == "run.start" or "ocs.identify" in ops
    assert ops.count("trial.start") == TRIALS and ops.count("trial.end") == TRIALS
    # Marks come from inside the actor: acked never precedes sent within one operation.
    marks = [e for e in events if e["type"] == "mark" and e["op"] in ("sent", "acked", "lit")]
    for sent, acked, lit in zip(marks[0::3], marks[1::3], marks[2::3], strict=False):
        if (sent["op"], acked["op"], lit["op"]) == ("sent", "acked", "lit"):
            assert sent["mono_ns"] < acked["mono_ns"] <= lit["mono_ns"]


def test_audit_has_every_exchange_with_timestamps(run):
    _, _, run_dir = run
    audit = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert {a["direction"] for a in audit} == {"tx", "rx"}
    assert all(a["device"] == "ocs1" and a["address"].startswith("TCPIP0::127.0.0.1::") for a in audit)
    assert any(a["data"].startswith("*OPC?") for a in audit)
    assert all(b["mono_ns"] >= a["mono_ns"] for a, b in zip(audit, audit[1:], strict=False))


def test_run_json_says_how_to_repeat_the_run(run):
    _, _, run_dir = run
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and info["emulate"] is True
    assert info["playbook"]["name"] == "ocs-reconfig"
    assert info["inventory"]["name"] == "emulated-rack"
    assert info["seed"] == 0 and info["trials"] == TRIALS
    assert info["versions"]["ray"] and info["versions"]["pyvisa"]
    assert info["clock"]["wall_start"] > 0
    assert info["devices"]["ocs1"]["size"] == [32, 32]
    assert info["twin"]["devices"]["ocs1"]["visa"].startswith("TCPIP0::127.0.0.1::")


def test_report_prints_the_table_and_json(run, capsys):
    _, _, run_dir = run
    assert main(["report", str(run_dir)]) == 0
    assert "reconfig.total" in capsys.readouterr().out
    assert main(["report", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((run_dir / "summary.json").read_text())


def test_report_on_a_folder_that_is_not_a_run_is_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
