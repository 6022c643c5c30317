"""A failover from a hung rank (process.hang: the rank stops, detected by its stalled progress) heals the hang
on the rank it hit, and the job fabric's light check uses the playbook's own thresholds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

pytestmark = pytest.mark.timeout(300)

JOB = """\
job:
  command: [testbed-train, --steps, "1000000", --dim, "16", --step-time, "0.02", --checkpoint-every, "10",
            --timeout, "10"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric: {topology: ring, port: p0, reverse_port: p1%s}
"""

HANG = (
    "name: hang-failover\ntrials: 2\n"
    + JOB % ""
    + """\
steps:
  - {action: job.start, wait_steps: 12}
  - {action: failover, fault: {kind: process.hang, target: "rank:1"}, heartbeat_ms: 50, stall_timeout_ms: 600}
  - {action: job.stop}
"""
)

# 0 dBm launched, 1 dB through the switch: every egress reads about -1 dBm, never +10.
BRIGHT = (
    "name: too-bright\ntrials: 1\n"
    + JOB % ", min_power_dbm: 10, light_timeout_ms: 300"
    + """\
steps:
  - {action: job.start, wait_steps: 1}
"""
)


def run(repo: Path, tmp_path: Path, text: str, capsys) -> tuple[int, Path, str]:
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(text)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    code = main(["run", str(playbook), "--emulate", "--inventory", inventory, "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    return code, Path(out.out.strip().splitlines()[-1].removeprefix("results: ")), out.err


def test_a_hung_rank_fails_over_and_its_hang_is_healed(ray_cluster, repo, tmp_path, capsys):
    code, run_dir, err = run(repo, tmp_path, HANG, capsys)
    assert code == 0, err
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    heals = [e for e in events if e["op"] == "fault.heal" and e["type"] != "invoke"]
    assert [e["type"] for e in heals] == ["ok", "ok"]
    assert all(e["data"]["kind"] == "process.hang" and e["data"]["rank"] == 1 for e in heals)
    resumed = [e for e in events if e["op"] == "gpu.resume_job" and e["type"] == "ok"]
    assert len(resumed) == 2 and all(e["device"] == "gpu02" for e in resumed)  # the host of the hung rank
    assert len([e for e in events if e["op"] == "failover.resumed"]) == 2
    assert main(["check", str(run_dir)]) == 0


def test_the_job_fabric_checks_light_against_the_playbooks_threshold(ray_cluster, repo, tmp_path, capsys):
    code, run_dir, err = run(repo, tmp_path, BRIGHT, capsys)
    assert code == 1
    assert "within 0.3 s (threshold 10.0 dBm)" in err  # the playbook's figures, not the defaults (5 s, -20 dBm)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["op"] == "ocs.reconfigure" and e["type"] == "fail"]
    assert failed and failed[0]["data"]["error_type"] == "VerificationError"
