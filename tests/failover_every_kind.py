"""A playbook that fails over once on every fault kind a failover takes, each on its own rank, in each of 5 trials
(a kind that leaves something behind in one trial, as a powered-off host did, shows in the next): shared
by the twin's test (tests/integration/test_failover_kinds.py) and the lab's (tests/lab/test_playbooks_on_a_lab.py).
"""

from __future__ import annotations

import json
from pathlib import Path

JOB_RANKS = ["gpu01", "gpu02", "gpu03", "gpu04"]
KINDS = {"gpu.fail": 1, "process.kill": 2, "process.hang": 0, "host.power_off": 3}  # kind -> the rank it hits
TRIALS = 5

PLAYBOOK = """\
name: failover-every-kind
trials: {trials}
job:
  command: [testbed-train, --steps, "1000000", --dim, "32", --step-time, "0.02", --checkpoint-every, "5",
            --timeout, "5"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric: {topology: ring, port: p0, reverse_port: p1}
steps:
"""


def playbook() -> str:
    steps = []
    for kind, rank in KINDS.items():
        steps += [
            "  - {action: job.start, wait_steps: 6}",
            f'  - {{action: failover, name: "failover-{kind}", fault: {{kind: {kind}, target: "rank:{rank}"}}, '
            "heartbeat_ms: 50, stall_timeout_ms: 2000, timeout_ms: 30000}",
            "  - {action: job.stop}",
        ]
    return PLAYBOOK.replace("{trials}", str(TRIALS)) + "\n".join(steps) + "\n"


def failovers(run_dir: Path) -> dict[tuple[int, str], dict]:
    """Each failover step's spare choice and resumption, by its trial and fault kind."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    out: dict[tuple[int, str], dict] = {}
    for e in events:
        step = e.get("step") or ""
        if not step.startswith("failover-"):
            continue
        key = (e.get("trial"), step.removeprefix("failover-"))
        if e["op"] == "spare_selected":
            out.setdefault(key, {})["selected"] = e["data"]
        elif e["op"] == "failover.resumed":
            out.setdefault(key, {})["resumed"] = e
        elif e["op"] == "fault.heal" and e["type"] == "ok":
            out.setdefault(key, {})["healed"] = True
    return out


def assert_each_failover_replaced_the_host_its_fault_hit(run_dir: Path) -> None:
    seen = failovers(run_dir)
    assert set(seen) == {(trial, kind) for trial in range(TRIALS) for kind in KINDS}, sorted(seen)
    for (_, kind), f in seen.items():
        rank = KINDS[kind]
        assert f["selected"]["failed"] == JOB_RANKS[rank] and f["selected"]["rank"] == rank, (kind, f)
        assert f["resumed"]["device"] == f["selected"]["spare"], (kind, f)  # the spare runs the failed rank now
        assert f.get("healed"), (kind, f)
