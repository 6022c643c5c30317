"""Failover with the photonic chip as the fabric: the chip is calibrated, reprogrammed for the spare (one
of the job's own chip-cabled spares), and the job resumes on it from the checkpoint.
"""

from __future__ import annotations

import json

from testbed.cli.main import main


def test_failover_over_the_chip_resumes_on_a_chip_cabled_spare(ray_cluster, repo, tmp_path):
    code = main(
        [
            "run",
            str(repo / "playbooks/mesh-failover.yaml"),
            "--emulate",
            "--trials",
            "1",
            "--results",
            str(tmp_path),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    assert code == 0
    run_dir = next(tmp_path.iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    spare = next(e["data"]["spare"] for e in events if e["op"] == "spare_selected")
    assert spare in ("gpu07", "gpu08")  # the job's spares, not the inventory's (they have no chip port)
    resumed = next(e for e in events if e["op"] == "failover.resumed")
    assert resumed["device"] == spare and resumed["data"]["step"] == resumed["data"]["resumed_from"] + 1
    chip_changes = [e for e in events if e["op"] == "mesh.reconfigure" and e["type"] == "ok"]
    # The ring at job.start and the rewiring through the spare, once: when a peer's exit was seen before the
    # failed rank's own, the failure is re-attributed to the rank the fault hit (a recorded mark), not re-wired.
    assert len(chip_changes) == 2
    for e in (e for e in events if e["op"] == "failure_reattributed"):
        assert e["data"]["failed"] == resumed["data"]["rank"] != e["data"]["first_seen"]
    assert (run_dir / "calibration-chip1.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spans"]["failover.total"]["n"] == 1
    assert main(["check", str(run_dir)]) == 0
