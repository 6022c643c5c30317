"""The planner is pure: same inputs, same plan; it resolves links through the fibre map and refuses
what the inventory forbids.
"""

from __future__ import annotations

import pytest

from testbed.documents import load_inventory
from testbed.documents.playbook import Playbook
from testbed.plan import PlanError, make_plan
from testbed.steps import ApplyStep, ParallelStep, WaitStep


@pytest.fixture(scope="module")
def inventory(repo):
    return load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model


def playbook(**extra) -> Playbook:
    data = {
        "name": "t",
        "trials": 3,
        "configurations": {"pair": {"links": ["gpu01:p0 <-> gpu02:p0"]}, "raw": {"circuits": {"ocs1": [[5, 40]]}}},
        "steps": [{"action": "fabric.apply", "configuration": "pair", "measure": "m"}],
    }
    data.update(extra)
    return Playbook.model_validate(data)


def test_links_resolve_through_the_fibre_map(inventory):
    plan = make_plan(playbook(), inventory)
    step = plan.trials[0].steps[0]
    assert isinstance(step, ApplyStep)
    # gpu01:p0 is cabled to ingress 1 / egress 33, gpu02:p0 to ingress 3 / egress 35.
    assert step.circuits == {"ocs1": ((1, 35), (3, 33))}
    # Ports of every configuration of the playbook are managed, the raw circuit's included.
    assert step.managed["ocs1"] == (1, 3, 5, 33, 35, 40)
    assert plan.devices == ("ocs1",) and plan.writes == ("ocs1",)


def test_trials_and_sweeps_expand_in_order(inventory):
    pb = playbook(sweep={"hold": [0, 10], "other": ["a", "b", "c"]}, steps=[{"action": "wait", "ms": "${hold}"}])
    plan = make_plan(pb, inventory, trials=2)
    assert len(plan.trials) == 2 * 3 * 2
    assert [t.index for t in plan.trials] == list(range(12))
    assert plan.trials[0].sweep_point == {"hold": 0, "other": "a"}
    assert plan.trials[-1].sweep_point == {"hold": 10, "other": "c"}
    waits = {t.steps[0].seconds for t in plan.trials}
    assert waits == {0.0, 0.01}
    assert all(isinstance(t.steps[0], WaitStep) for t in plan.trials)


def test_same_inputs_give_the_same_plan(inventory):
    assert make_plan(playbook(), inventory, seed=7) == make_plan(playbook(), inventory, seed=7)


def test_reserved_port_is_refused_at_plan_time(inventory):
    pb = playbook(
        configurations={"tap": {"circuits": {"ocs1": [[31, 40]]}}},
        steps=[{"action": "fabric.apply", "configuration": "tap"}],
    )
    with pytest.raises(PlanError, match=r"interlock.*\[31\].*reserves"):
        make_plan(pb, inventory)


def test_read_only_switch_is_refused(inventory):
    ro = inventory.model_copy(
        update={
            "devices": {**inventory.devices, "ocs1": inventory.devices["ocs1"].model_copy(update={"read_only": True})}
        }
    )
    with pytest.raises(PlanError, match="read-only"):
        make_plan(playbook(), ro)


def test_a_port_used_twice_in_one_configuration_is_refused(inventory):
    pb = playbook(
        configurations={"bad": {"links": ["gpu01:p0 -> gpu02:p0", "gpu03:p0 -> gpu02:p0"]}},
        steps=[{"action": "fabric.apply", "configuration": "bad"}],
    )
    with pytest.raises(PlanError, match="egress port"):
        make_plan(pb, inventory)


def test_parallel_steps_are_planned_recursively(inventory):
    pb = playbook(
        steps=[
            {
                "action": "parallel",
                "steps": [{"action": "fabric.apply", "configuration": "pair"}, {"action": "wait", "ms": 5}],
            }
        ]
    )
    step = make_plan(pb, inventory).trials[0].steps[0]
    assert isinstance(step, ParallelStep)
    assert isinstance(step.steps[0], ApplyStep) and isinstance(step.steps[1], WaitStep)


def test_trials_override_must_be_positive(inventory):
    with pytest.raises(PlanError):
        make_plan(playbook(), inventory, trials=0)


def test_a_schedule_cycle_expands_into_one_measured_apply_per_matching(inventory):
    hosts = [f"gpu{i:02d}" for i in range(1, 9)]
    pb = Playbook.model_validate(
        {
            "name": "a2a",
            "trials": 1,
            "schedules": {"a2a": {"kind": "all-to-all", "hosts": hosts, "port": "p2"}},
            "setup": [{"action": "device.calibrate", "device": "chip1"}],
            "steps": [{"action": "fabric.cycle", "schedule": "a2a", "measure": "m", "crosstalk": True}],
        }
    )
    plan = make_plan(pb, inventory)
    steps = plan.trials[0].steps
    assert [s.configuration for s in steps] == [f"a2a[{k}]" for k in range(1, 8)]
    assert all(isinstance(s, ApplyStep) and s.measure == "m" and s.crosstalk for s in steps)
    # Matching k on the chip: host i's input i goes to host i+k's output 8 + (i+k).
    assert steps[0].circuits == {"chip1": tuple((i, 8 + (i % 8) + 1) for i in range(1, 9))}
    assert plan.devices == ("chip1",)
    assert plan.setup[0].device == "chip1"


def test_calibrating_a_read_only_device_is_refused(inventory):
    ro = inventory.model_copy(
        update={
            "devices": {**inventory.devices, "chip1": inventory.devices["chip1"].model_copy(update={"read_only": True})}
        }
    )
    pb = playbook(setup=[{"action": "device.calibrate", "device": "chip1"}])
    with pytest.raises(PlanError, match="chip1 is read-only"):
        make_plan(pb, ro)


def _fault_playbook(limit: int, kind) -> Playbook:
    return Playbook.model_validate(
        {
            "name": "faults",
            "trials": 12,
            "max_concurrent_faults": limit,
            "job": {"command": ["testbed-train"], "ranks": ["gpu01", "gpu02"]},
            "steps": [
                {"action": "job.start"},
                {
                    "action": "parallel",
                    "steps": [
                        {"action": "fault.inject", "fault": {"kind": kind, "device": "ocs1"}},
                        {"action": "fault.inject", "fault": {"kind": "process.hang"}},
                    ],
                },
            ],
        }
    )


def test_more_faults_at_once_than_the_playbook_allows_is_refused(inventory):
    with pytest.raises(PlanError, match="2 faults active at once.*max_concurrent_faults: 1"):
        make_plan(_fault_playbook(1, "transport.down"), inventory)
    plan = make_plan(_fault_playbook(2, "transport.down"), inventory)
    assert plan.transport_faults and "ocs1" in plan.devices  # the twin must emulate (and proxy) the device


def test_a_list_of_fault_kinds_is_a_seeded_draw_per_trial(inventory):
    kinds = ["transport.latency", "transport.down", "transport.reset_peer"]
    drawn = [
        [s.kind for s in t.steps[1].steps if s.device]
        for t in make_plan(_fault_playbook(2, kinds), inventory, seed=3).trials
    ]
    again = [
        [s.kind for s in t.steps[1].steps if s.device]
        for t in make_plan(_fault_playbook(2, kinds), inventory, seed=3).trials
    ]
    assert drawn == again  # the same seed gives the same chaos
    assert {k for (k,) in drawn} == set(kinds)  # and over 12 trials every kind is drawn


def test_a_transport_fault_cannot_start_a_failover(inventory):
    pb = Playbook.model_validate(
        {
            "name": "x",
            "job": {"command": ["testbed-train"], "ranks": ["gpu01", "gpu02"]},
            "steps": [{"action": "failover", "fault": {"kind": "transport.down", "device": "ocs1"}}],
        }
    )
    with pytest.raises(PlanError, match="breaks a connection, not a rank"):
        make_plan(pb, inventory)
