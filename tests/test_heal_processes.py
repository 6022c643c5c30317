"""`testbed heal` signals only what the run itself started: a process whose record (pid, start time, owner, run id,
taken when the run started it) still holds; a Ray session or a network-namespace tag only if the run left its own
mark on it. Each forged folder below names a live bystander, as an attacker would; none is signalled or removed.

Whether a bystander was signalled is told without waiting: the test sends it SIGTERM itself once heal has
returned, and a process heal had SIGKILLed dies of that SIGKILL (the first fatal signal wins), not of SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from accounts import BOB, needs_root
from peers import require_peer
from rich.console import Console

from testbed.engine.ray_session import session_folder_problem
from testbed.engine.run_marks import mark_netns, mark_ray_session, process_problem, process_record
from testbed.ops.heal import heal_run
from testbed.results.recorder import Recorder
from testbed.twin import netns

RANK = "rank0.1"  # every run's rank 0 on its first host has this job name


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=200)  # noqa: SIM115


def signalled(proc: subprocess.Popen) -> bool:
    """Whether someone else SIGKILLed `proc` before now."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30) == -signal.SIGKILL


def dead_twin_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def emulated_run(run_dir: Path, jobs: list[dict] = (), **info) -> Path:
    """An emulated run whose runner and twin died after starting `jobs` (gpu.start_job handles)."""
    run_dir.mkdir(mode=0o755)
    runner = {"pid": os.getpid(), "start_ticks": -1, "hostname": socket.gethostname()}  # not this process
    record = {"run": run_dir.name, "status": "running", "emulate": True, "twin_pid": dead_twin_pid()}
    # A valid inventory, as a forger writes one: heal before the records read it, and refused an invalid one
    # before acting, so a forgery with an empty one proved nothing.
    inventory = {"name": "lab", "devices": {}}
    record |= {"runner": runner, "playbook": {"name": "forged"}, "trials": 1, "inventory": inventory, **info}
    (run_dir / "run.json").write_text(json.dumps(record))
    recorder = Recorder(run_dir, run_dir.name)
    for job in jobs:
        recorder.emit("invoke", "gpu.start_job", device=job["host"], step="job", data={"name": job["name"]})
        recorder.emit("ok", "gpu.start_job", device=job["host"], step="job", data={"value": job, "duration_ms": 1.0})
    recorder.close()
    return run_dir


def handle(pid: int) -> dict:
    return {"host": "gpu01", "name": RANK, "pid": pid, "log": "rank0.1.log", "workdir": "."}


def heal(run_dir: Path) -> tuple[int, dict]:
    code = heal_run(run_dir, quiet())
    return code, json.loads((run_dir / "run.json").read_text())["healed"]


# --- job processes: the four-part record ----------------------------------------------------------------------


@needs_root
def test_a_forged_job_naming_another_users_rank_is_not_signalled(tmp_path):
    """Bob's live rank 0 (TESTBED_JOB=rank0.1, as every run's): a forged gpu.start_job names it, with a record that
    copies its real pid, start time and owner; heal, run as root, leaves it alone and says why.
    """
    bobs_rank = subprocess.Popen(
        ["sleep", "120"], user=BOB, group=BOB, extra_groups=[], env={"TESTBED_JOB": RANK}, start_new_session=True
    )
    try:
        run_dir = emulated_run(tmp_path / "forged", jobs=[handle(bobs_rank.pid)])
        forged = {"host": "gpu01", "name": RANK, **process_record(bobs_rank.pid, run_dir.name)}
        (run_dir / "processes.jsonl").write_text(json.dumps(forged) + "\n")
        code, healed = heal(run_dir)
        assert code == 1 and f"the run recorded it as uid {BOB}'s, not yours" in " ".join(healed["problems"])
        forged["uid"] = 0  # a record claiming the healer's own account: /proc says whose it is
        assert process_problem(forged, run_dir.name) == f"it is uid {BOB}'s, not the run's"
        assert not signalled(bobs_rank)
    finally:
        bobs_rank.kill()
        bobs_rank.wait()


def test_a_job_with_no_record_or_a_stale_one_is_not_signalled(tmp_path):
    """The healer's own process with the rank's name: named with no record of its start, or with another start
    time (its pid reused), or by another run's record, it is not the run's rank.
    """
    mine = subprocess.Popen(["sleep", "120"], env={"TESTBED_JOB": RANK}, start_new_session=True)
    try:
        run_dir = emulated_run(tmp_path / "forged", jobs=[handle(mine.pid)])
        code, healed = heal(run_dir)
        assert code == 1 and "no record of it was taken when the run started it" in " ".join(healed["problems"])
        record = process_record(mine.pid, run_dir.name)
        assert process_problem({**record, "start_ticks": record["start_ticks"] - 1}, run_dir.name) == (
            "its pid is another process now (another start time)"
        )
        assert process_problem(record, "another-run").startswith("its record names another run")
        assert process_problem(record, run_dir.name) is None  # the run's own record: that process, the run's
        assert not signalled(mine)
    finally:
        mine.kill()
        mine.wait()


# --- a Ray session: the run's own mark -----------------------------------------------------------------------


def ray_session(base: Path) -> Path:
    session = base / "session_2026-11-27_18-00-00_000001_4242"
    (session / "logs").mkdir(parents=True)
    (session / "sockets").mkdir()
    (session / "logs" / "raylet.out").write_text("")
    return session


def holder(session: Path) -> subprocess.Popen:
    """A live process of this account holding a file in the session (as another run's raylet does)."""
    hold = "import sys, time; f = open(sys.argv[1]); print('up', flush=True); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", hold, str(session / "logs" / "raylet.out")], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"  # the file is open from here on
    return proc


def test_a_forged_ray_session_naming_another_live_session_ends_nothing(tmp_path):
    """run.json names another live run's Ray session (a real session folder of this account): it carries no mark of
    this run, so heal ends none of its processes; the run's own session, marked, has its leftovers ended.
    """
    session = ray_session(tmp_path / "ray")
    bystander = holder(session)
    try:
        assert session_folder_problem(str(session)) is None  # a real session folder: no longer enough
        run_dir = emulated_run(tmp_path / "forged", ray={"session_dir": str(session)})
        code, healed = heal(run_dir)
        assert code == 1 and "it carries no mark of this run" in " ".join(healed["problems"])
        assert not signalled(bystander)
    finally:
        bystander.kill()
        bystander.wait()
        bystander.stdout.close()

    leftover = holder(session)
    try:
        own = emulated_run(tmp_path / "own", ray={"session_dir": str(session)})
        assert mark_ray_session(str(session), own.name, own) is None  # as the run marks it when Ray starts
        code, healed = heal(own)
        assert code == 0 and any("leftover process(es) of the run's Ray instance" in d for d in healed["done"])
        assert leftover.wait(30) == -signal.SIGKILL
        # A copy of the run's folder is another folder: the mark names the original, so the copy ends nothing.
        copy = emulated_run(tmp_path / "copy", run=own.name, ray={"session_dir": str(session)})
        assert "it carries no mark of this run" in " ".join(heal(copy)[1]["problems"])
    finally:
        leftover.kill()
        leftover.wait()
        leftover.stdout.close()


# --- a --netns tag: the run's own mark ------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_a_forged_netns_tag_removes_nothing_of_another_run(tmp_path):
    """run.json names another live run's namespace tag: its namespace, and the process in it, are left as they are;
    marked as the run's own, they are removed.
    """
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")
    tag = os.urandom(3).hex()
    name = f"testbed-{tag}-gpu01"
    subprocess.run(["ip", "netns", "add", name], check=True)
    inside = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "120"])
    try:
        run_dir = emulated_run(tmp_path / "forged", twin={"netns": {"tag": tag}})
        code, healed = heal(run_dir)
        assert code == 1 and f"tagged testbed-{tag}-* are there, but it carries no mark" in " ".join(healed["problems"])
        assert name in netns.leftovers(tag)["namespaces"]
        assert not signalled(inside)

        inside = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "120"])
        own = emulated_run(tmp_path / "own", twin={"netns": {"tag": tag}})
        assert mark_netns(tag, own.name, own) is None  # as the run marks them when its twin has made them
        code, healed = heal(own)
        assert code == 0, healed
        assert netns.leftovers(tag) == {"namespaces": [], "links": [], "processes": []}
        assert inside.wait(30) == -signal.SIGKILL
    finally:
        inside.kill()
        inside.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
