"""`launcher: torchrun` through the CLI on the twin (Ray hubs, as a user runs it): failovers of a torchrun job
measure every milestone, agree with the twin's ground truth, and `testbed check` finds the run sound.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.results.milestones import MILESTONES

pytestmark = pytest.mark.timeout(300)

PLAYBOOK = """\
name: torchrun-failover
trials: 2
job:
  command: [testbed-train, --steps, "1000000", --dim, "16", --step-time, "0.02", --checkpoint-every, "10",
            --timeout, "10"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  launcher: torchrun
  fabric: {topology: ring, port: p0, reverse_port: p1}
steps:
  - {action: job.start, wait_steps: 12}
  - {action: failover, fault: {kind: gpu.fail, target: "rank:0"}, heartbeat_ms: 50}
  - {action: job.stop}
"""


def test_torchrun_failovers_through_the_cli(ray_cluster, repo, tmp_path, capsys):
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    code = main(["run", str(playbook), "--emulate", "--inventory", inventory, "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0, out.err
    run_dir = Path(out.out.strip().splitlines()[-1].removeprefix("results: "))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for trial in (0, 1):
        marks = {e["op"] for e in events if e.get("trial") == trial and e["type"] == "mark"}
        assert set(MILESTONES) <= marks
    starts = [e["data"] for e in events if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
    assert len(starts) == 16  # one torchrun per host, launched and relaunched in each trial
    assert {s["name"].split(".")[0] for s in starts} == {"node0", "node1", "node2", "node3"}
    resumed = [e for e in events if e["op"] == "failover.resumed"]
    assert len(resumed) == 2 and all(e["data"]["rank"] == 0 and e["data"]["resumed_from"] > 0 for e in resumed)
    # rank 0's host was lost: the relaunch's rendezvous host (TESTBED_MASTER_HOST) is the spare
    relaunched = [s for s in starts if s["name"] in ("node0.2", "node0.4")]
    assert [s["env"]["TESTBED_MASTER_HOST"] for s in relaunched] == [e["device"] for e in resumed]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ground_truth"]["matched"] == 2
    assert main(["check", str(run_dir)]) == 0
