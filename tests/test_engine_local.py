"""The engine's logic runs in-process, without Ray: the coordinator, the job and a whole failover, through a
LocalDispatcher of DeviceActor objects, with the real drivers against the twin's real endpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.documents import load_inventory, load_playbook
from testbed.engine.coordinator import Coordinator
from testbed.engine.device_actor import DeviceActor
from testbed.engine.dispatch import LocalDispatcher
from testbed.engine.job import JobController, watcher
from testbed.events import Op
from testbed.families import family_of
from testbed.plan import make_plan
from testbed.results.milestones import MILESTONES
from testbed.results.recorder import Recorder
from testbed.twin.bridge import start_twin

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(240)


class CountingDispatcher(LocalDispatcher):
    """A LocalDispatcher that also lists the calls it starts (actor, method)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def call(self, actor, method, *args):
        self.calls.append((actor, method))
        return super().call(actor, method, *args)


def engine_for(plan, inventory, twin, run_dir: Path) -> tuple[Coordinator, CountingDispatcher, Recorder]:
    dispatcher = CountingDispatcher()
    for name in plan.devices:
        dev = inventory.devices[name]
        actor = DeviceActor(name, dev.driver, dev.transport.settings(), family_of(dev).policy(name, dev), dev.kind)
        dispatcher.add(name, actor)
        if plan.playbook.job is not None and family_of(dev).role == "host":
            # the job's second connection to each host, which watches its rank (two calls at once)
            dispatcher.add(
                watcher(name), DeviceActor(name, dev.driver, dev.transport.settings(), None, dev.kind), concurrency=2
            )
    recorder = Recorder(run_dir, "local")
    coordinator = Coordinator(plan, dispatcher, recorder, artifacts=run_dir, twin=twin)
    if plan.playbook.job is not None:
        coordinator.jobs = JobController(
            coordinator,
            plan.playbook.job,
            lambda host: "127.0.0.1",
            inventory=inventory,
            managed=plan.job_managed,
            seed=plan.seed,
            link=twin.dataplane_link,
        )
    return coordinator, dispatcher, recorder


def test_a_failover_runs_in_process_with_every_milestone(tmp_path):
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    plan = make_plan(load_playbook(REPO / "playbooks/gpu-failover.yaml", base).model, base, trials=1)
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        try:
            identified = coordinator.identify()
            assert identified["ocs1"]["size"] == [32, 32]
            coordinator.execute_steps(plan.trials[0].steps)
            fabric = coordinator.read_fabric()
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    marks = [e["op"] for e in events if e["type"] == "mark"]
    assert all(m in marks for m in MILESTONES)
    resumed = next(e for e in events if e["op"] == Op.FAILOVER_RESUMED)
    assert resumed["device"] in ("gpu09", "gpu10") and resumed["data"]["resumed_from"] > 0
    spans = {e["op"] for e in events if e["type"] == "measure"}
    assert "failover.total" in spans
    spare = inventory.fibre_of(resumed["device"], "p0")
    assert len(fabric["ocs1"]) == 8 and spare.ingress in fabric["ocs1"]  # the duplex ring of four, through the spare


def test_a_step_on_one_switch_batches_into_one_program(tmp_path):
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    plan = make_plan(load_playbook(REPO / "playbooks/ocs-reconfig.yaml", base).model, base, trials=1)
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        try:
            coordinator.execute_steps(plan.trials[0].steps)
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    assert dispatcher.calls == [("ocs1", "run_program")]  # three reconfigurations, one round trip
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["data"]["ms"] > 20 for e in events if e["op"] == "reconfig.ack"] == [True, True, True]


def _environ(pid: int) -> dict[str, str]:
    """A running rank's environment, as the kernel holds it (the emulated hosts run ranks on this machine)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_ranks_get_pytorchs_rendezvous_and_it_moves_with_rank_0(tmp_path):
    """MASTER_ADDR / MASTER_PORT name rank 0's host (torch.distributed's env:// contract), with
    LOCAL_WORLD_SIZE; when rank 0 is the one lost, the relaunched job is told the spare's.
    """
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    data = load_playbook(REPO / "playbooks/gpu-failover.yaml", base).model.model_dump(mode="json", exclude_unset=True)
    data["steps"][1]["fault"]["target"] = "rank:0"
    playbook = load_playbook(_write(tmp_path / "rank0.yaml", data), base).model
    plan = make_plan(playbook, base, trials=1)
    job_start, failover, job_stop = plan.trials[0].steps
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        jobs = coordinator.jobs
        try:
            coordinator.execute_steps([job_start])
            before = {rank: _environ(handle["pid"]) for rank, handle in jobs.handles.items()}
            coordinator.execute_steps([failover])
            after = {rank: _environ(handle["pid"]) for rank, handle in jobs.handles.items()}
            spare = jobs.ranks[0].host
            coordinator.execute_steps([job_stop])
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    assert spare in ("gpu09", "gpu10")  # rank 0 was failed over
    for env, master in ((before, "gpu01"), (after, spare)):
        assert sorted(env) == [0, 1, 2, 3]
        assert {e["TESTBED_MASTER_HOST"] for e in env.values()} == {master}
        assert {e["MASTER_ADDR"] for e in env.values()} == {"127.0.0.1"}  # every emulated host is this machine
        assert len({e["MASTER_PORT"] for e in env.values()}) == 1
        assert all(e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "1" for e in env.values())
        assert [e["RANK"] for _, e in sorted(env.items())] == ["0", "1", "2", "3"]
        # the rendezvous port is none of the ranks' own listening ports
        own = {e["TESTBED_PEERS"].split(",")[int(e["RANK"])].rpartition(":")[2] for e in env.values()}
        assert env[0]["MASTER_PORT"] not in own


def _write(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
