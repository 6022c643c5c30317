"""`testbed plan` is the honest dry run: for every shipped playbook it prints every step of every trial (and of
setup and teardown), with the devices each drives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from testbed.config import load_inventory, load_playbook
from testbed.plan import make_plan
from testbed.plan_view import print_plan
from testbed.steps import (
    STEP_KINDS,
    ApplyStep,
    FaultDetectStep,
    FaultInjectStep,
    HealthStep,
    JobMeasureStep,
    Planned,
    RailIterateStep,
    walk,
)

REPO = Path(__file__).resolve().parent.parent
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yaml"))
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"


def shown(plan) -> str:
    console = Console(record=True, width=400, file=open("/dev/null", "w"))  # noqa: SIM115
    print_plan(console, plan, str(INVENTORY))
    return console.export_text()


def test_every_kind_of_planned_step_has_its_own_description():
    """A planned step that fell back on Planned.describe would show its label only; each kind says more."""
    kinds = {type(p) for path in PLAYBOOKS for p in plan_of(path).all_steps()}
    assert len(STEP_KINDS.names()) == 14 and len(kinds) >= 12
    assert [k.__name__ for k in kinds if k.describe is Planned.describe] == []


def plan_of(path):
    inventory = load_inventory(INVENTORY).model
    return make_plan(load_playbook(path, inventory).model, inventory, trials=3)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.stem)
def test_plan_prints_every_step_of_every_trial_with_its_devices(path):
    plan = plan_of(path)
    text = shown(plan)
    # every trial is under a branch: "trial i" or "trials a..b"
    covered = set()
    for match in re.finditer(r"trials? (\d+)(?:\.\.(\d+))?", text):
        covered.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    assert covered >= {t.index for t in plan.trials}
    job = plan.playbook.job
    for trial in [*plan.trials, type("Once", (), {"steps": (*plan.setup, *plan.teardown)})]:
        for step in walk(trial.steps):
            assert step.label in text, f"{path.name}: step {step.label!r} is not shown"
            if isinstance(step, ApplyStep):
                for switch, pairs in step.circuits.items():
                    assert f"{switch}: {len(pairs)} circuits" in text
            if isinstance(step, RailIterateStep):
                for phase in step.phases:
                    for switch, pairs in phase.apply.circuits.items():
                        assert f"{switch}: {len(pairs)} circuits" in text
            if isinstance(step, FaultInjectStep) and step.device is not None:
                assert f"{step.device}'s connection" in text
            elif isinstance(step, FaultDetectStep | FaultInjectStep | JobMeasureStep):
                assert f"rank {step.rank} ({job.ranks[step.rank]})" in text
            if isinstance(step, HealthStep):
                assert ", ".join(step.hosts) in text
    if job is not None:
        assert f"{len(job.ranks)} ranks on" in text
        for switch, pairs in plan.job_circuits.items():
            assert f"{switch}: {len(pairs)} circuits" in text
    for device in plan.devices:
        assert f"{device}: " in text
