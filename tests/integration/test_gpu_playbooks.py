"""GPU-host playbooks end to end on the twin: a parallel health check, and failure detection of a real
training job whose ranks are killed or whose GPU falls off the emulated bus.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

INVENTORY = "playbooks/inventory/emulated-rack.yaml"
DETECTION_TRIALS = 2


def run(repo: Path, tmp: Path, playbook: str, *extra: str) -> Path:
    code = main(
        ["run", str(repo / playbook), "--emulate", "--results", str(tmp), "--inventory", str(repo / INVENTORY), *extra]
    )
    assert code == 0
    return next(tmp.iterdir())


def test_health_check_of_every_host(ray_cluster, repo, tmp_path, capsys):
    run_dir = run(repo, tmp_path, "playbooks/gpu-health.yaml")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary["health"]) == [f"gpu{i:02d}" for i in range(1, 11)]
    assert all(h["ok"] and len(h["gpus"]) == 8 for h in summary["health"].values())
    assert summary["spans"]["health.wall"]["n"] == 1
    assert "NVIDIA H100 80GB HBM3" in capsys.readouterr().out


@pytest.fixture(scope="module")
def detection_run(ray_cluster, repo, tmp_path_factory) -> Path:
    return run(
        repo, tmp_path_factory.mktemp("results"), "playbooks/detect-failure.yaml", "--trials", str(DETECTION_TRIALS)
    )


def test_every_injected_failure_is_detected_after_it_happened(detection_run):
    summary = json.loads((detection_run / "summary.json").read_text())
    assert summary["status"] == "ok"
    detected = ("detect-kill.latency", "detect-gpu.latency")  # one fault of each kind per trial
    for span in detected:
        assert summary["spans"][span]["n"] == DETECTION_TRIALS
    events = [json.loads(line) for line in (detection_run / "events.jsonl").read_text().splitlines()]
    # Never before the fault was sent. The injection's moment is the midpoint of the call that made it, so on a
    # busy machine a watch can see the exit before that midpoint (docs/faults.md, "When a fault happened"); it
    # can never see it before the call went out, nor be off by more than half the call.
    for trial in range(DETECTION_TRIALS):
        mine = [e for e in events if e.get("trial") == trial]
        sent = [e["mono_ns"] for e in mine if e["op"] == "fault.inject" and e["type"] == "invoke"]
        done = [e["mono_ns"] for e in mine if e["op"] == "fault.inject" and e["type"] == "ok"]
        measured = [e for e in mine if e["type"] == "measure" and e["op"] in detected]
        assert len(sent) == len(done) == len(measured) == len(detected)
        for m, t_sent, t_done in zip(measured, sent, done, strict=True):
            assert m["data"]["end_ns"] > t_sent, (trial, m)
            assert m["data"]["ms"] * 1e6 >= -(t_done - t_sent) / 2, (trial, m)
    gpu = [e for e in events if e["type"] == "measure" and e["op"] == "detect-gpu.latency"]
    # The GPU fault is seen for what it is: the rank's process died and nvidia-smi / the kernel log say why.
    assert all(e["data"]["kind"] in ("gpu_lost", "xid") for e in gpu)
    assert all("79" in e["data"]["evidence"] for e in gpu)
    injected = [e for e in events if e["op"] == "fault_injected"]
    assert len(injected) == 4  # one per fault: 2 trials x (process.kill, gpu.fail)
    described = [
        e for e in events if e["op"] in ("fault_injected", "fault_described") and "watching" in e.get("data", {})
    ]
    assert len(described) == 4 and all(e["data"]["watching"] for e in described)


def test_every_fault_is_healed_and_the_history_checks(detection_run):
    events = [json.loads(line) for line in (detection_run / "events.jsonl").read_text().splitlines()]
    assert sum(e["op"] == "fault.heal" and e["type"] == "ok" for e in events) == 4
    assert main(["check", str(detection_run)]) == 0
