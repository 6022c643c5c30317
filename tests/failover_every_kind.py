"""A playbook that fails over once on every fault kind a failover takes, each on its own rank, in one trial: shared
by the twin's test (tests/integration/test_failover_kinds.py) and the lab's (tests/lab/test_playbooks_on_a_lab.py).
"""

from __future__ import annotations

import json
from pathlib import Path

JOB_RANKS = ["gpu01", "gpu02", "gpu03", "gpu04"]
KINDS = {"gpu.fail": 1, "process.kill": 2, "process.hang": 0, "host.power_off": 3}  # kind -> the rank it hits

PLAYBOOK = """\
name: failover-every-kind
trials: 1
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
            "heartbeat_ms: 50, stall_timeout_ms: 2000}",
            "  - {action: job.stop}",
        ]
    return PLAYBOOK + "\n".join(steps) + "\n"


def failovers(run_dir: Path) -> dict[str, dict]:
    """Each failover step's spare choice and resumption, by its fault kind."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    out: dict[str, dict] = {}
    for e in events:
        step = e.get("step") or ""
        if not step.startswith("failover-"):
            continue
        kind = step.removeprefix("failover-")
        if e["op"] == "spare_selected":
            out.setdefault(kind, {})["selected"] = e["data"]
        elif e["op"] == "failover.resumed":
            out.setdefault(kind, {})["resumed"] = e
        elif e["op"] == "fault.heal" and e["type"] == "ok":
            out.setdefault(kind, {})["healed"] = True
    return out


def assert_each_failover_replaced_the_host_its_fault_hit(run_dir: Path) -> None:
    seen = failovers(run_dir)
    assert set(seen) == set(KINDS), seen
    for kind, rank in KINDS.items():
        f = seen[kind]
        assert f["selected"]["failed"] == JOB_RANKS[rank] and f["selected"]["rank"] == rank, (kind, f)
        assert f["resumed"]["device"] == f["selected"]["spare"], (kind, f)  # the spare runs the failed rank now
        assert f.get("healed"), (kind, f)
