"""What the in-job failover tests share (tests/integration/test_injob_failover.py, test_torch_failover.py and
tests/netns/test_injob_netns.py): one failover run in-process to act on the job at a chosen moment, and the
reading of the survivors' own words for the step they failed in. Here in tests/ so that every test folder can
import it (tests/conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from test_engine_local import engine_for

from testbed.contracts.errors import StepFailed
from testbed.documents import load_inventory, load_playbook
from testbed.engine.run import _job_controller
from testbed.plan import make_plan
from testbed.twin.bridge import start_twin

REPO = Path(__file__).resolve().parent.parent
SPARES = ("gpu09", "gpu10")  # the emulated rack's spare hosts


def failed_failover(
    playbook: str,
    run_dir: Path,
    stall: Callable,
    heal: Callable | None = None,
    *,
    truth: Path | None = None,
    netns: bool = False,
) -> str:
    """One trial of `playbook` (job.start, a failover that must fail, job.stop) on the emulated rack, run
    in-process (a LocalDispatcher of DeviceActors, the real drivers against the twin's real endpoints), with
    `stall(jobs)` done between job.start and the failover, and `heal(jobs)` (if given) once it failed, before
    job.stop; the failover's error, its white space folded. `truth`: where the twin writes its record, if anywhere.
    """
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    (run_dir / "stall.yaml").write_text(playbook)
    plan = make_plan(load_playbook(run_dir / "stall.yaml", base).model, base, trials=1)
    job_start, failover, job_stop = plan.trials[0].steps
    with start_twin(plan, truth, netns=netns) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, run_dir)
        if netns:  # the ranks reach each other at their namespaces' addresses, which `testbed run`'s controller knows
            coordinator.jobs = _job_controller(plan, inventory, coordinator, twin, True)
        jobs = coordinator.jobs
        try:
            coordinator.execute_steps([job_start])
            stall(jobs)
            with pytest.raises(StepFailed) as failed:
                coordinator.execute_steps([failover])
            if heal is not None:
                heal(jobs)
        finally:
            try:
                coordinator.execute_steps([job_stop])
            finally:
                coordinator.close()
                dispatcher.close()
                recorder.close()
    return " ".join(str(failed.value).split())


def survivors(starts: list[dict], slot: str) -> list[str]:
    """The jobs of generation 0's ranks that outlived the fault: job.start's but the failed slot's and the spares'."""
    return [s["data"]["name"] for s in starts if s["device"] not in (slot, *SPARES)]


def steps_failed_in(truth: list[dict], jobs: list[str]) -> set[int]:
    """The steps `jobs` said (in the twin's record) that generation 0 failed in."""
    return {
        int(m[1])
        for r in truth
        if r.get("event") == "line" and r["job"] in jobs
        for m in [re.match(r"^rank \d+ gen 0 failed in step (\d+): ", r["line"])]
        if m
    }
