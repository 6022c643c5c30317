"""host.straggle on a lab: the real SSH driver (drivers/gpuhost/) starts and stops the duty-cycle agent
testbed-straggle on an emulated host's SSH server, which runs it as a real process (a job of the host); the
fault kind's lab path goes through the gpuhost procedures in the runner's DeviceActor; `testbed heal` ends an
agent a dead run left running, and continues a rank an agent killed outright left stopped.

The emulated host's processes are children of this test process, so the rank's state is read in /proc.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from proc_state import state, stopped_fraction, wait_state

from drivers.errors import DeviceCommandError
from testbed.documents.inventory import Inventory
from testbed.engine.device_actor import DeviceActor
from testbed.events import Op, read_jsonl
from testbed.families.drivers import make_driver
from testbed.faults import FAULT_KINDS, FaultEnv, FaultFailed, RankTarget
from testbed.ops.heal import HealDevices
from testbed.ops.remains import find
from testbed.results.recorder import Recorder

KIND = FAULT_KINDS.get("host.straggle")


@pytest.fixture
def drv(settings):
    d = make_driver("ssh", "gpu01", settings)
    yield d
    d.close()


@pytest.fixture
def rank(drv):
    """A rank of a job: a job of the emulated host, leading its own process group."""
    return drv.run_job(["sleep", "60"], name="rank0.1", gpus=[0])


def agents_on(host) -> list[dict]:
    """The emulated host's live straggler agents, as its control reports them."""
    return [j for j in host.engine.state()["jobs"] if j["argv"][0] == "testbed-straggle" and j["alive"]]


def actor(settings) -> DeviceActor:
    """The runner's DeviceActor for the host, used in-process (no Ray)."""
    interval = sys.getswitchinterval()
    try:
        return DeviceActor("gpu01", "ssh", settings, None, "gpu_host")
    finally:
        sys.setswitchinterval(interval)  # the actor tunes the interpreter for a Ray worker, not for pytest


def lab_env(act: DeviceActor) -> FaultEnv:
    """What the engine gives a fault kind on a lab (testbed.faults.recording.fault_env): no twin, and the
    device procedures, each returning its OpResult or raising when it did not succeed.
    """

    def call(device: str, procedure: str, kwargs: dict):
        assert device == "gpu01"
        result = act.run(procedure, kwargs)
        if result.status != "ok":
            raise FaultFailed(f"{procedure}: {result.status}: {result.error}")
        return result

    return FaultEnv(None, call)


def inventory_for(settings) -> Inventory:
    return Inventory.model_validate(
        {
            "name": "lab",
            "devices": {
                "gpu01": {
                    "kind": "gpu_host",
                    "driver": "ssh",
                    "transport": {
                        "type": "ssh",
                        "host": settings.host,
                        "port": settings.port,
                        "user": settings.user,
                        "key_file": settings.key_file,
                        "known_hosts": settings.known_hosts,
                    },
                    "gpus": 4,
                }
            },
        }
    )


# --- the driver -------------------------------------------------------------------------------------------


def test_the_driver_starts_the_agent_on_the_host_and_stops_it(drv, rank, gpu_host):
    before = time.monotonic_ns()
    agent, arrived_ns, log = drv.start_straggle(rank, 0.5, 100)
    assert before < arrived_ns <= time.monotonic_ns()
    assert log == f"{rank.workdir}/straggle-{rank.pid}.log"
    # The host's own tools see the agent: a process of its own, not a GPU process.
    assert drv.straggle_agents(rank.pid) == [agent]
    # Alive and not stopped itself: running or sleeping, whichever a busy machine catches it in.
    assert drv.exec(f"ps -o stat= -p {agent}").stdout.strip()[:1] in ("R", "S")
    assert [j["pid"] for j in agents_on(gpu_host)] == [agent] and agents_on(gpu_host)[0]["gpus"] == []
    assert [p.pid for p in drv.processes()] == [rank.pid]

    fraction, cycles = stopped_fraction(rank.pid, 1.0)
    assert abs(fraction - 0.5) < 0.12 and 7 <= cycles <= 12

    done = drv.stop_straggle(rank, agent)
    assert done == {
        "agents": [{"pid": agent, "result": "terminated"}],
        "agent": "terminated",
        "left_stopped": False,
        "rank": "continued",
    }
    assert agents_on(gpu_host) == [] and drv.straggle_agents(rank.pid) == []
    assert state(rank.pid) in ("S", "R") and drv.job_status(rank).state == "running"
    text = drv.tail(log)
    assert f"testbed-straggle {agent} started" in text and f"testbed-straggle {agent} ended (SIGTERM)" in text
    # Again: nothing left to stop, the rank still continued.
    again = drv.stop_straggle(rank, agent)
    assert again == {"agents": [], "agent": "not running", "left_stopped": False, "rank": "continued"}


def test_starting_the_agent_on_a_rank_that_is_gone_fails_with_the_agents_reason(drv, rank):
    drv.stop_job(rank)
    with pytest.raises(DeviceCommandError, match=f"exited before it started: .*cannot start: no process {rank.pid}"):
        drv.start_straggle(rank, 0.5, 100)
    assert drv.stop_straggle(rank) == {"agents": [], "agent": None, "left_stopped": False, "rank": "not running"}


def test_power_off_takes_the_agent_with_the_rank(drv, rank, gpu_host):
    agent, _, _ = drv.start_straggle(rank, 0.5, 100)
    killed = gpu_host.engine.power_off()["killed"]
    assert set(killed) == {rank.pid, agent}
    assert agents_on(gpu_host) == [] and state(agent) in (None, "Z") and state(rank.pid) in (None, "Z")
    gpu_host.engine.power_on()


def test_a_lost_gpu_leaves_the_agent_running(drv, rank, gpu_host):
    agent, _, _ = drv.start_straggle(rank, 0.5, 100)
    gpu_host.engine.fail_gpu(0)  # kills the rank, which holds GPU 0; the agent holds none
    # The agent then finds its target gone and ends by itself.
    deadline = time.monotonic() + 10
    while agents_on(gpu_host) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert agents_on(gpu_host) == []
    assert "ended (gone)" in drv.tail(f"{rank.workdir}/straggle-{rank.pid}.log")
    assert gpu_host.engine.state()["jobs"][1]["returncode"] == 0 and agent == gpu_host.engine.state()["jobs"][1]["pid"]


# --- the fault kind's lab path ----------------------------------------------------------------------------


def test_host_straggle_on_a_lab_injects_through_the_agent_and_heals(settings, drv, rank, gpu_host):
    act = actor(settings)
    try:
        env = lab_env(act)
        target = RankTarget(0, "gpu01", 0, {**rank.__dict__}, {"duty": 0.5, "period_s": 0.1})
        before = time.monotonic_ns()
        injected = KIND.inject(env, target)
        assert injected.marked_by_device and before < injected.at_ns <= time.monotonic_ns()
        (agent,) = [j["pid"] for j in agents_on(gpu_host)]
        fraction, _ = stopped_fraction(rank.pid, 1.0)
        assert abs(fraction - 0.5) < 0.12  # the rank is being duty-cycled

        KIND.heal(env, target)
        assert agents_on(gpu_host) == [] and state(agent) in (None, "Z")
        assert state(rank.pid) in ("S", "R")
        assert wait_state(rank.pid, {"T"}, timeout=0.3) != "T"  # and it stays running
    finally:
        act.close()


def test_the_heal_of_a_lab_straggle_continues_a_rank_its_killed_agent_left_stopped(settings, drv, rank, gpu_host):
    act = actor(settings)
    try:
        env = lab_env(act)
        target = RankTarget(0, "gpu01", 0, {**rank.__dict__}, {"duty": 0.9, "period_s": 2.0})
        KIND.inject(env, target)
        (agent,) = [j["pid"] for j in agents_on(gpu_host)]
        assert wait_state(rank.pid, {"T"}) == "T"
        drv.signal(agent, "KILL", group=False)
        assert state(rank.pid) == "T"
        KIND.heal(env, target)
        assert state(rank.pid) in ("S", "R")
    finally:
        act.close()


# --- testbed heal of a dead run ---------------------------------------------------------------------------


def dead_run(tmp_path, settings, rank, *, duty: float, period_s: float, finished: bool) -> list[dict]:
    """Record what a runner that dies in the middle of a lab straggle leaves in its history: the fault's
    injection (its outcome `ok`, or still open when not `finished`) and the start of the agent inside it,
    recorded as the runner records a device call. The agent is left running on the host.
    """
    recorder = Recorder(tmp_path, "dead")
    lab = HealDevices(inventory_for(settings), recorder)
    step = "host.straggle on rank 0, duty 0.5"
    data = {"fault": "host.straggle@rank0", "kind": "host.straggle", "rank": 0, "host": "gpu01", "gpu": 0}
    data |= {"pid": rank.pid, "duration_s": 600.0}
    recorder.emit("ok", "gpu.start_job", device="gpu01", step="job.start", data={"value": {**rank.__dict__}})
    recorder.emit("invoke", Op.FAULT_INJECT, device="gpu01", step=step, data=data)
    kwargs = {"job": {**rank.__dict__}, "duty": duty, "period_ms": period_s * 1000}
    if finished:
        lab.call("gpu01", "gpu.straggle_start", kwargs, step)
        recorder.emit("ok", Op.FAULT_INJECT, device="gpu01", step=step, data=data)
    else:  # the runner died while the agent started: its pid was never recorded
        recorder.emit("invoke", "gpu.straggle_start", device="gpu01", step=step, data=kwargs)
        make_driver("ssh", "gpu01", settings).start_straggle(rank, duty, period_s * 1000)
    lab.close()
    recorder.close()
    return read_jsonl(tmp_path / "events.jsonl").records


def heal_dead(tmp_path, settings) -> tuple[str, list[dict]]:
    events = read_jsonl(tmp_path / "events.jsonl").records
    (fault,) = find(events).faults
    recorder = Recorder(tmp_path, "heal")
    lab = HealDevices(inventory_for(settings), recorder)  # no twin control: a lab
    try:
        how = KIND.heal_after_crash(lab, fault)
    finally:
        lab.close()
        recorder.close()
    return how, read_jsonl(tmp_path / "events.jsonl").records[len(events) :]


def test_heal_ends_the_agent_a_dead_run_left_running_and_continues_the_rank(tmp_path, settings, rank, gpu_host):
    events = dead_run(tmp_path, settings, rank, duty=0.5, period_s=0.1, finished=True)
    (agent,) = [j["pid"] for j in agents_on(gpu_host)]
    (fault,) = find(events).faults
    assert fault.certain and fault.job["pid"] == rank.pid
    started = [c for c in fault.calls if c["op"] == "gpu.straggle_start"]
    assert started[0]["value"]["agent"] == agent  # the history names the agent

    how, healed = heal_dead(tmp_path, settings)
    assert how == f"straggler agents on gpu01: {agent} terminated (the run's agent {agent}: terminated); " + (
        f"SIGCONT to pid {rank.pid}'s process group"
    )
    assert agents_on(gpu_host) == [] and state(rank.pid) in ("S", "R")
    stop = next(e for e in healed if e["op"] == "gpu.straggle_stop" and e["type"] == "ok")
    assert stop["data"]["value"]["agent"] == "terminated"
    assert json.dumps(stop)  # the history stays JSON


def test_heal_finds_an_agent_whose_start_the_dead_run_never_saw_end(tmp_path, settings, rank, gpu_host):
    events = dead_run(tmp_path, settings, rank, duty=0.5, period_s=0.1, finished=False)
    (agent,) = [j["pid"] for j in agents_on(gpu_host)]
    (fault,) = find(events).faults
    assert not fault.certain and fault.calls == []
    how, _ = heal_dead(tmp_path, settings)
    assert how.startswith(f"straggler agents on gpu01: {agent} terminated;")
    assert agents_on(gpu_host) == [] and state(rank.pid) in ("S", "R")


def test_heal_continues_a_rank_a_dead_runs_killed_agent_left_stopped(tmp_path, settings, drv, rank, gpu_host):
    dead_run(tmp_path, settings, rank, duty=0.9, period_s=2.0, finished=True)
    (agent,) = [j["pid"] for j in agents_on(gpu_host)]
    assert wait_state(rank.pid, {"T"}) == "T"
    drv.signal(agent, "KILL", group=False)  # the agent killed outright, mid-stop: nobody continues the rank
    # kill returns once the signal is sent, before the agent has died: heal comes after its death (a zombie
    # until the host reaps it, which heal must count as not running, or gone).
    assert wait_state(agent, {"Z", None}) in ("Z", None)
    assert state(rank.pid) == "T"
    how, _ = heal_dead(tmp_path, settings)
    assert how == (
        f"straggler agents on gpu01: none running (the run's agent {agent}: not running); "
        f"pid {rank.pid}'s process group was left stopped: SIGCONT"
    )
    assert state(rank.pid) in ("S", "R")


def test_heal_of_a_straggle_whose_rank_is_gone_has_nothing_to_continue(tmp_path, settings, drv, rank, gpu_host):
    dead_run(tmp_path, settings, rank, duty=0.5, period_s=0.1, finished=True)
    drv.stop_job(rank)
    how, _ = heal_dead(tmp_path, settings)
    assert how.endswith(f"pid {rank.pid} is gone: nothing is left stopped")
    assert agents_on(gpu_host) == []
