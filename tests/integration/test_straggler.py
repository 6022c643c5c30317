"""A persistent straggler slows the whole ring: with one rank stopped half of every period, the job's iterations
hold the stops (tests/straggler_evidence.py: from the measured step intervals, not a ratio of two timings that a
busy machine can skew); the fault is injected and healed.
"""

from __future__ import annotations

import json

from straggler_evidence import assert_the_stops_slowed_the_job, straggled_intervals

from testbed.cli.main import main


def test_one_straggling_rank_slows_the_whole_job(ray_cluster, repo, tmp_path):
    playbook = (repo / "playbooks/straggler.yaml").read_text().replace("duty: [0.25, 0.5, 0.75]", "duty: [0.5]")
    (tmp_path / "straggler.yaml").write_text(playbook)
    code = main(
        [
            "run",
            str(tmp_path / "straggler.yaml"),
            "--emulate",
            "--results",
            str(tmp_path / "r"),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    assert code == 0
    run_dir = next((tmp_path / "r").iterdir())
    spans = json.loads((run_dir / "summary.json").read_text())["spans"]
    assert {"baseline.time", "straggled.time"} <= set(spans)
    assert_the_stops_slowed_the_job(straggled_intervals(run_dir), duty=0.5, period_ms=200)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["op"] for e in events if e["op"] in ("fault.inject", "fault.heal") and e["type"] == "ok"] == [
        "fault.inject",
        "fault.heal",
    ]
    assert main(["check", str(run_dir)]) == 0
