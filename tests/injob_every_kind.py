"""A playbook that fails over in-job (`job.recovery: in-job`, the real PyTorch job) on every fault kind a failover
takes, each on its own rank, in each of several trials, and what every such failover must show: shared by the
twin's test (tests/integration/test_injob_failover.py) and the lab's (tests/lab/test_playbooks_on_a_lab.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from testbed.events import Op

JOB_RANKS = ["gpu01", "gpu02", "gpu03", "gpu04"]
SPARES = {"gpu09", "gpu10"}
KINDS = {"gpu.fail": 1, "process.kill": 2, "process.hang": 0, "host.power_off": 3}  # kind -> the rank it hits
JOB = """\
job:
  command: [testbed-torch-train, --steps, "1000000", --dim, "16", --hidden, "32", --step-time, "0.02",
            --checkpoint-every, "10", --timeout, "{timeout}", --start-timeout, "120"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  recovery: in-job
  fabric: {{topology: ring, port: p0, reverse_port: p1}}
"""


def playbook(trials: int) -> str:
    steps = []
    for kind, rank in KINDS.items():
        steps += [
            "  - {action: job.start, wait_steps: 6, timeout_ms: 240000}",
            f'  - {{action: failover, name: "failover-{kind}", fault: {{kind: {kind}, target: "rank:{rank}"}}, '
            "heartbeat_ms: 50, stall_timeout_ms: 2000, timeout_ms: 30000}",
            "  - {action: job.stop}",
        ]
    head = f"name: in-job-every-kind\ntrials: {trials}\n" + JOB.format(timeout=10)
    return head + "steps:\n" + "\n".join(steps) + "\n"


def assert_each_failover_recovered_in_job(run_dir: Path, trials: int, lines: dict[str, list[str]] | None) -> None:
    """Every (trial, kind): the host the fault hit replaced by a parked spare in generation 1, nothing started, the
    fault healed; with `lines` (job name -> its output lines: the twin's record), the spare's first step is the
    newest step a survivor failed in (none lost).
    """
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for trial in range(trials):
        for kind, rank in KINDS.items():
            mine = [e for e in events if e.get("trial") == trial and e.get("step") == f"failover-{kind}"]
            (selected,) = [e["data"] for e in mine if e["op"] == Op.SPARE_SELECTED]
            assert selected["failed"] == JOB_RANKS[rank] and selected["rank"] == rank, (trial, kind, selected)
            (resumed,) = [e for e in mine if e["op"] == Op.FAILOVER_RESUMED]
            assert resumed["device"] == selected["spare"] in SPARES
            (published,) = [e["data"] for e in mine if e["op"] == Op.GENERATION_PUBLISHED]
            assert published == {"generation": 1, "slot": JOB_RANKS[rank], "spare": selected["spare"], "rank": rank}
            assert not [e for e in mine if e["op"] == "gpu.start_job"], "a failover in-job starts no process"
            assert any(e["op"] == "fault.heal" and e["type"] == "ok" for e in mine), (trial, kind)
            if lines is None:
                continue
            # the job.start before this failover: its processes' job names
            starts = [
                e
                for e in events
                if e.get("trial") == trial
                and e["op"] == "gpu.start_job"
                and e["type"] == "invoke"
                and e["seq"] < mine[0]["seq"]
            ][-6:]
            survivors = [s["data"]["name"] for s in starts if s["device"] not in (JOB_RANKS[rank], *SPARES)]
            assert len(survivors) == 3, starts
            failed_in = {
                int(m[1])
                for name in survivors
                for line in lines.get(name, [])
                if (m := re.match(r"^rank \d+ gen 0 failed in step (\d+): ", line))
            }
            # no step lost: the spare's first step is the newest one a survivor failed in (one that finished the
            # step as the rank died failed in the next, and the state of that step went to the others)
            assert failed_in and resumed["data"]["step"] == max(failed_in), (trial, kind, failed_in, resumed)
