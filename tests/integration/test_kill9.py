"""kill -9 of `testbed run` in the middle of a fault: the event log stays whole, `testbed heal` restores the
lab from it, and `testbed check` passes on the healed run.

The lab is a standalone twin (its own process, as `testbed emulate` runs it) reached through an inventory
that points at it: for the runner and for heal it is a real lab that outlives them. A second test kills
an `--emulate` run, whose twin dies with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from accounts import BOB, as_account, needs_root, shared_folder
from runner_process import cli, read_events, start_run, wait_for_event

from drivers.transports import TransportSettings
from emulators.twin import TwinProcess
from testbed.documents import load_inventory, load_playbook
from testbed.engine.ray_session import leftovers, runner_identity
from testbed.families.drivers import make_driver
from testbed.leases import Holder
from testbed.leases.file_store import FileLeaseStore
from testbed.leases.identity import device_identity
from testbed.plan import make_plan
from testbed.twin.bridge import point_at_twin, twin_spec

PLAYBOOK = """\
name: hang-kill9
description: a rank hung for ten minutes, on a job whose ring runs over the OCS
trials: 1
job:
  command: [testbed-train, --steps, "1000000", --dim, "16", --step-time, "0.02", --timeout, "600"]
  ranks: [gpu01, gpu02]
  fabric: {topology: ring, port: p0, reverse_port: p1}
steps:
  - {action: job.start, wait_steps: 2}
  - {action: fault.inject, fault: {kind: process.hang, target: "rank:1"}, duration_ms: 600000}
  - {action: job.stop}
"""
# Before the run the switch holds a circuit on a port the job's fabric takes (1: gpu01:p0's transmitter)
# and one on ports the run never touches; heal must give back exactly these.
BEFORE = {1: 40, 21: 53}


def kill9(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def running(pid: int) -> bool:
    """A live process (a zombie nobody reaped yet is not one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def rank_jobs(events: list[dict]) -> dict[str, dict]:
    return {
        e["data"]["value"]["name"]: e["data"]["value"]
        for e in events
        if e["op"] == "gpu.start_job" and e["type"] == "ok"
    }


@pytest.fixture()
def lab(repo, tmp_path):
    """A standalone twin of the playbook's devices, and an inventory file that points at it."""
    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    playbook_file = tmp_path / "hang.yaml"
    playbook_file.write_text(PLAYBOOK)
    plan = make_plan(load_playbook(str(playbook_file), inventory).model, inventory)
    with TwinProcess(twin_spec(inventory, 0, only=set(plan.devices))) as twin:
        pointed = point_at_twin(inventory, twin.endpoints.to_json()).model_copy(update={"emulated_only": False})
        inventory_file = tmp_path / "lab.yaml"
        inventory_file.write_text(yaml.safe_dump(pointed.model_dump(mode="json", exclude_none=True)))
        yield twin, playbook_file, inventory_file, pointed


def switch_circuits(twin: TwinProcess) -> dict[int, int]:
    return {i: e for i, e in twin.control.call("ocs1", "state")["connections"]}


def test_kill9_mid_fault_then_heal_restores_the_lab_and_check_passes(repo, tmp_path, lab):
    twin, playbook_file, inventory_file, inventory = lab
    t = inventory.devices["ocs1"].transport
    ocs = make_driver("polatis-scpi", "ocs1", TransportSettings("visa", t.resource, 5.0, read_termination="\n"))
    ocs.connect(list(BEFORE.items()))
    ocs.wait_settled()
    ocs.close()

    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--inventory", str(inventory_file), "--results", str(results), "--yes"])
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    assert switch_circuits(twin) != BEFORE  # the job's ring is up, through port 1
    kill9(proc)

    events = read_events(run_dir / "events.jsonl")  # every line parses: nothing torn
    assert (run_dir / "events.jsonl").read_bytes().endswith(b"\n")
    hung = rank_jobs(events)["rank1.1"]
    jobs = {j["pid"]: j for j in twin.control.call("gpu02", "state")["jobs"]}
    assert jobs[hung["pid"]]["alive"]  # the runner died with the rank still stopped

    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "fault process.hang@rank1: SIGCONT" in healed.stdout
    after = read_events(run_dir / "events.jsonl")
    heal_ops = [(e["type"], e["op"], e.get("device")) for e in after[len(events) :]]
    # The hung rank was continued, then every rank of the run stopped.
    assert ("ok", "gpu.resume_job", "gpu02") in heal_ops and ("ok", "fault.heal", "gpu02") in heal_ops
    assert {("ok", "gpu.stop_job", "gpu01"), ("ok", "gpu.stop_job", "gpu02")} <= set(heal_ops)
    for host in ("gpu01", "gpu02"):
        assert not any(j["alive"] for j in twin.control.call(host, "state")["jobs"])
    # The switch holds what it held before the run, and heal recorded that read-back as the final fabric.
    assert switch_circuits(twin) == BEFORE
    final = next(e for e in reversed(after) if e["op"] == "fabric.final")
    assert {int(i): o for i, o in final["data"]["circuits"]["ocs1"].items()} == BEFORE

    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "aborted" and info["healed"]["ok"]
    assert leftovers(info["ray"]["session_dir"]) == []  # nothing of the dead runner's Ray instance is left
    again = cli("heal", str(run_dir), cwd=repo)
    assert again.returncode == 0 and "nothing to heal" in again.stdout


@needs_root
def test_heal_never_drives_a_device_another_user_holds_by_then(repo, tmp_path, lab, monkeypatch):
    """The dead run's leases lapse, another user takes the switch: heal is refused before it writes anything,
    naming the holder; once the switch is free again, heal restores the lab.
    """
    folder = shared_folder()
    monkeypatch.setenv("TESTBED_LEASE_DIR", str(folder))
    twin, playbook_file, inventory_file, inventory = lab
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--inventory", str(inventory_file), "--results", str(results), "--yes"])
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    kill9(proc)
    FileLeaseStore(folder).release(ids=[lease.id for lease in FileLeaseStore(folder).list()])  # as if lapsed
    identity = device_identity(inventory.devices["ocs1"].transport)

    def reserve():
        holder = Holder(str(BOB), "ctrl-b", 77)
        return FileLeaseStore(folder).acquire({"ocs1": identity}, holder, "reservation", 600, "bob's turn")

    (bob,) = as_account(BOB, reserve)
    before = (run_dir / "events.jsonl").read_text()
    refused = cli("heal", str(run_dir), cwd=repo)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"ocs1 ({identity}) is reserved by {BOB}@ctrl-b" in refused.stderr and "Traceback" not in refused.stderr
    assert (run_dir / "events.jsonl").read_text() == before  # nothing done, nothing recorded
    hung = rank_jobs(read_events(run_dir / "events.jsonl"))["rank1.1"]
    assert {j["pid"]: j for j in twin.control.call("gpu02", "state")["jobs"]}[hung["pid"]]["alive"]

    as_account(BOB, lambda: FileLeaseStore(folder).release(ids=[bob.id]))
    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "heal holds the lab's leases on" in healed.stdout
    assert FileLeaseStore(folder).list() == []  # heal's own leases given back at its end


@pytest.mark.parametrize("mid_injection", [False, True], ids=["after-the-injection", "mid-injection"])
def test_kill9_of_an_emulated_run_heal_records_that_the_twin_went_with_it(repo, tmp_path, mid_injection):
    playbook_file = tmp_path / "hang.yaml"
    playbook_file.write_text(PLAYBOOK)
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--emulate", "--results", str(results)])
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    # Only the runner's own process this time: what its Ray instance leaves behind is heal's to end.
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    info = json.loads((run_dir / "run.json").read_text())
    events = read_events(run_dir / "events.jsonl")
    if mid_injection:  # the history as a kill during the injection leaves it: it ends at the fault's invoke
        inject = next(e for e in events if e["op"] == "fault.inject" and e["type"] == "invoke")
        lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
        (run_dir / "events.jsonl").write_text("".join(lines[: inject["seq"]]))
    # A write the kill tore in half, as it could have: heal sets it aside and says so.
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"seq": 999, "type": "invo')

    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "last line was torn" in healed.stdout
    assert f"twin (pid {info['twin_pid']}) is gone" in healed.stdout
    assert "1 fault(s) went with it: process.hang@rank1" in healed.stdout
    if mid_injection:  # closed as of unknown outcome, still naming the fault it may have left
        after = read_events(run_dir / "events.jsonl")
        closed = [e for e in after if e["op"] == "fault.inject" and e["type"] != "invoke"]
        assert [(e["type"], e["data"]["fault"], e["data"]["kind"], e["data"]["invoke_seq"]) for e in closed] == [
            ("info", "process.hang@rank1", "process.hang", inject["seq"])
        ]
        assert closed[0]["data"]["audit_lost"]
    assert not running(info["twin_pid"])
    for job in rank_jobs(events).values():  # the twin's ranks went with it (heal ends any it left)
        assert not running(job["pid"])
    assert leftovers(info["ray"]["session_dir"]) == []
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "nothing to read back" in checked.stdout

    # The next run on this machine is not disturbed by anything the killed one left.
    nxt = cli("run", "playbooks/gpu-health.yaml", "--emulate", "--results", str(results), cwd=repo)
    assert nxt.returncode == 0, nxt.stdout + nxt.stderr


def test_heal_refuses_a_live_run_and_a_folder_that_is_no_run(repo, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A run whose runner is this very process: still running, so not heal's to touch.
    info = {"run": "r", "inventory": {}, "status": "running", "runner": runner_identity()}
    (run_dir / "run.json").write_text(json.dumps(info))
    (run_dir / "events.jsonl").write_text("")
    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 2 and f"runner (pid {os.getpid()}) is still running" in healed.stderr
    nothing = cli("heal", str(tmp_path), cwd=repo)
    assert nothing.returncode == 2 and "not a readable run folder" in nothing.stderr
    assert "Traceback" not in healed.stderr + nothing.stderr


def test_sigterm_mid_fault_heals_it_and_tears_down_like_ctrl_c(repo, tmp_path):
    playbook_file = tmp_path / "hang.yaml"
    playbook_file.write_text(PLAYBOOK)
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--emulate", "--results", str(results)])
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 1, proc.stderr.read()
    events = read_events(run_dir / "events.jsonl")
    assert next(e for e in events if e["op"] == "run.aborted")["data"]["reason"] == "terminated (SIGTERM)"
    assert [e["type"] for e in events if e["op"] == "fault.heal"] == ["invoke", "ok"]
    assert {e["device"] for e in events if e["op"] == "gpu.stop_job" and e["type"] == "ok"} == {"gpu01", "gpu02"}
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "nothing to heal" in cli("heal", str(run_dir), cwd=repo).stdout
