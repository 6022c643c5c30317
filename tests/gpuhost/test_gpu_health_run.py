"""A health check with `details: true` on the twin, end to end (Ray, the hosts' actors, the real driver over SSH):
a GPU put in a condition a lab acts on (pending retired pages, a power brake) is named in that host's recorded
`health` mark and summary, and that host alone is reported unhealthy.
"""

from __future__ import annotations

import pytest
from rich.console import Console

import testbed

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_the_health_run_names_the_conditions_of_a_degraded_gpu(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    playbook = tmp_path / "gpu-health-details.yaml"
    playbook.write_text("name: gpu-health-details\ntrials: 1\nsteps:\n  - {action: hosts.health, details: true}\n")
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True)) as lab:
        before = lab.run(playbook)  # brings the twin up: every GPU healthy
        assert before.ok, before.error
        assert all(h["ok"] and h["conditions"] == [] for h in before.summary["health"].values())
        control = lab._devices.twin.control  # the twin the warm Lab keeps for its next run
        control.call("gpu03", "degrade_gpu", index=5, condition="pending_retired_pages")
        control.call("gpu03", "degrade_gpu", index=1, condition="hw_power_brake_slowdown")
        after = lab.run(playbook)
    assert after.ok, after.error
    marks = {e["device"]: e["data"] for e in after.events() if e["type"] == "mark" and e["op"] == "health"}
    assert len(marks) == 10 and not marks["gpu03"]["ok"]
    assert [(c["gpu"], c["condition"]) for c in marks["gpu03"]["conditions"]] == [
        (1, "hw_slowdown"),
        (1, "hw_power_brake_slowdown"),
        (5, "pending_retired_pages"),
    ]
    assert marks["gpu03"]["lost"] == [] and marks["gpu03"]["xids"] == []  # only the report says so
    reading = next(r for r in marks["gpu03"]["readings"] if r["index"] == 5)
    assert reading["retired_pages"]["pending"] is True and reading["bus_id"] == "00000000:AB:00.0"
    assert all(h["ok"] for host, h in marks.items() if host != "gpu03")
    assert after.summary["health"]["gpu03"]["conditions"] == marks["gpu03"]["conditions"]
