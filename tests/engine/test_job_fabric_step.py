"""The job's fabric as the switches must hold it: the circuits of a duplex ring over the assigned hosts, rewired
for a spare, changed only on the ports the job owns, with the playbook's light settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.contracts.errors import StepFailed
from testbed.documents import load_inventory, load_playbook
from testbed.engine.job.fabric import fabric_step
from testbed.plan import make_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan():
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    return make_plan(load_playbook(REPO / "playbooks/gpu-failover.yaml", base).model, base, trials=1)


def ring_circuits(inventory, hosts: list[str]) -> set[tuple[int, int]]:
    """Each neighbour pair's duplex link, p0 of a host to p1 of the next, as (switch in, switch out) pairs."""
    circuits = set()
    for i, host in enumerate(hosts):
        nxt = hosts[(i + 1) % len(hosts)]
        there, back = inventory.fibre_of(host, "p0"), inventory.fibre_of(nxt, "p1")
        circuits |= {(there.ingress, back.egress), (back.ingress, there.egress)}
    return circuits


@pytest.mark.parametrize("hosts", [["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu09", "gpu02", "gpu03", "gpu04"]])
def test_the_switch_holds_a_duplex_link_between_every_pair_of_ring_neighbours(plan, hosts):
    job = plan.playbook.job
    step = fabric_step(job.fabric, hosts, plan.inventory, plan.job_managed, "rewire")
    assert set(step.circuits) == {"ocs1"}
    assert set(step.circuits["ocs1"]) == ring_circuits(plan.inventory, hosts)
    assert step.managed == {"ocs1": plan.job_managed["ocs1"]}  # other circuits go only from the job's own ports
    assert (step.label, step.verify_light, step.min_power_dbm) == ("rewire", True, job.fabric.min_power_dbm)
    assert step.timeout_s == job.fabric.light_timeout_ms / 1000


def test_a_host_holding_two_ranks_cannot_be_on_a_job_fabric(plan):
    with pytest.raises(StepFailed, match="one rank per host"):
        fabric_step(plan.playbook.job.fabric, ["gpu01", "gpu01", "gpu02"], plan.inventory, plan.job_managed, "x")


def test_a_host_without_a_fibre_to_a_switch_is_refused(plan):
    with pytest.raises(StepFailed, match="job fabric: "):
        fabric_step(plan.playbook.job.fabric, ["gpu01", "no-such-host"], plan.inventory, plan.job_managed, "x")
