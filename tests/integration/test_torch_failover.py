"""playbooks/torch-failover.yaml and torch-failover-restart.yaml through the CLI on the twin, as a user runs them:
a real PyTorch job (testbed-torch-train over gloo) loses a rank's GPU and the spare is swapped in over the OCS.
In-job (torch-failover.yaml): no rank is restarted; the parked spare takes the failed slot in the next generation
and the job trains on at the step it failed in. Restart (torch-failover-restart.yaml, under PyTorch's own
torchrun): every rank resumes from the checkpoint. The failover's milestones are measured and `testbed check` finds
each run sound. Without PyTorch, `validate` and `plan` of the playbook work and `run` says what to install, as
does the program itself on a host without it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from injob_harness import steps_failed_in, survivors
from peers import environment_without, require_peer

from testbed.cli.main import main
from testbed.events import Op
from testbed.results.milestones import IN_JOB_MILESTONES, MILESTONES

PLAYBOOK = "playbooks/torch-failover.yaml"
RESTART = "playbooks/torch-failover-restart.yaml"
INSTALL = "pip install 'testbed[torch]'"
# One failover: ~30 s on an idle 2-core machine (eight Pythons importing PyTorch at each launch); the margin is
# for a loaded one.
pytestmark = pytest.mark.timeout(600)


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _truth(run_dir: Path) -> list[dict]:
    """The twin's own record of the run: what each host started, and every line a job's output carried."""
    return [json.loads(line) for line in (run_dir / "twin_truth.jsonl").read_text().splitlines()]


def _lines(run_dir: Path, host: str, job: str) -> list[str]:
    """What a job wrote on a host, in order."""
    return [r["line"] for r in _truth(run_dir) if r.get("event") == "line" and r["host"] == host and r["job"] == job]


def _losses(lines: list[str]) -> dict[int, str]:
    return {int(m[1]): m[2] for m in (re.match(r"^step (\d+) loss (\S+)$", line) for line in lines) if m}


def test_a_real_pytorch_job_recovers_in_job_at_the_step_it_failed_in(ray_cluster, repo, tmp_path, capsys):
    """Two trials in one run: in each, the parked spare (started with the job) takes the failed rank's slot, no
    process is started during the failover, and the spare's first step is the step the survivors failed in.
    """
    require_peer("torch", "the real PyTorch job (testbed-torch-train) runs on the CPU build of PyTorch")
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    args = ["run", str(repo / PLAYBOOK), "--emulate", "--trials", "2", "--inventory", inventory]
    code = main([*args, "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0, out.err
    run_dir = Path(out.out.strip().splitlines()[-1].removeprefix("results: "))
    events = _events(run_dir)
    truth = _truth(run_dir)
    for trial in (0, 1):
        mine = [e for e in events if e.get("trial") == trial]
        marks = {e["op"] for e in mine if e["type"] == "mark"}
        assert set(IN_JOB_MILESTONES) <= marks and Op.JOB_RELAUNCHED not in marks
        measured = {e["op"] for e in mine if e["type"] == "measure"}
        assert {"failover.publish", "failover.ready", "failover.first_step", "failover.total"} <= measured
        # job.start started the four ranks and a spare on each spare host; the failover started nothing
        starts = [e for e in mine if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
        assert sorted(s["device"] for s in starts) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu10"]
        assert {s["step"] for s in starts} == {"start job"}
        (resumed,) = [e for e in mine if e["op"] == "failover.resumed"]
        (published,) = [e for e in mine if e["op"] == Op.GENERATION_PUBLISHED]
        spare, rank = resumed["device"], resumed["data"]["rank"]
        failed = published["data"]["slot"]
        assert published["data"] == {"generation": 1, "slot": failed, "spare": spare, "rank": rank}
        spare_job = next(s["data"]["name"] for s in starts if s["device"] == spare)
        spare_lines = [r["line"] for r in truth if r.get("event") == "line" and r["job"] == spare_job]
        start = resumed["data"]["resumed_from"]
        parked = spare_lines.index(f"spare parked slot {spare} waiting for generation 0")  # warm before the fault
        assert parked < spare_lines.index(f"ready rank {rank} world 4 step {start}")
        assert f"ready rank {rank} world 4 step {start}" in spare_lines
        assert any(line.startswith(f"resumed from step {start} (state of rank ") for line in spare_lines)
        # the spare's first step is the step the survivors failed in (one that finished the step's all-reduce as
        # the rank died failed in the next; the state of the newest step went to the others): none lost
        outlived = survivors(starts, failed)
        assert len(outlived) == 3
        failed_in = steps_failed_in(truth, outlived)
        assert failed_in and resumed["data"]["step"] == max(failed_in) == start + 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ground_truth"]["matched"] == 2
    assert main(["check", str(run_dir)]) == 0


def test_a_real_pytorch_job_restarted_under_torchrun_fails_over_and_resumes(ray_cluster, repo, tmp_path, capsys):
    """recovery: restart, the baseline: every rank stopped and started again, resuming from the checkpoint."""
    require_peer("torch", "the real PyTorch job (testbed-torch-train) runs on the CPU build of PyTorch")
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    args = ["run", str(repo / RESTART), "--emulate", "--trials", "1", "--inventory", inventory]
    code = main([*args, "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 0, out.err
    run_dir = Path(out.out.strip().splitlines()[-1].removeprefix("results: "))
    events = _events(run_dir)
    marks = [e["op"] for e in events if e["type"] == "mark"]
    assert set(MILESTONES) <= set(marks)
    measured = {e["op"] for e in events if e["type"] == "measure"}
    assert {"failover.total", "failover.relaunch", "failover.ready", "failover.first_step"} <= measured

    # One torchrun per host, launched and relaunched, each running the PyTorch job under PyTorch's torchrun.
    starts = [e for e in events if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
    assert len(starts) == 8
    assert all(start["data"]["env"]["TESTBED_TWIN_TORCHRUN"] == "real" for start in starts)
    spawned = [r["argv"] for r in _truth(run_dir) if r.get("event") == "spawn"]
    assert len(spawned) == 8
    for argv in spawned:
        assert argv[0] == "torchrun" and argv[argv.index("--no-python") + 1] == "testbed-torch-train"

    # first_step is the spare's rank's first optimizer step after the checkpoint it resumed from.
    (resumed,) = [e for e in events if e["op"] == "failover.resumed"]
    spare, rank, start = resumed["device"], resumed["data"]["rank"], resumed["data"]["resumed_from"]
    assert spare in ("gpu09", "gpu10") and start > 0 and start % 10 == 0
    assert resumed["data"]["step"] == start + 1
    relaunch = next(s for s in starts if s["device"] == spare)
    spare_lines = _lines(run_dir, spare, relaunch["data"]["name"])
    assert f"ready rank {rank} world 4 step {start}" in spare_lines
    assert any(line.startswith(f"resumed from step {start} (checkpoint of rank ") for line in spare_lines)

    # The job resumed from its newest checkpoint (one every 10 steps), which restores the model and the optimizer:
    # the losses after it repeat the ones the job printed for the same steps before the fault, if it printed any
    # past the checkpoint (the batches are drawn from seed, rank and step; the loss is the ranks' mean, the same on
    # every rank). Read every survivor: the restart stops the ranks wherever each is, so one may be stopped before
    # printing a step that another printed and checkpointed.
    first = [s for s in starts if s["data"]["name"].endswith(".1")]  # the launch before the fault
    lost = next(s["device"] for s in first if s["data"]["name"] == f"node{rank}.1")
    before: dict[int, str] = {}
    for survivor in (s for s in first if s["device"] != lost):
        for step, loss in _losses(_lines(run_dir, survivor["device"], survivor["data"]["name"])).items():
            assert before.setdefault(step, loss) == loss, f"step {step}: the ranks printed different losses"
    after = _losses(spare_lines)
    assert max(before) - 10 <= start <= max(before)
    again = sorted(set(before) & set(after))  # the spare prints its first steps before the job is stopped
    assert set(again) <= set(range(start + 1, max(before) + 1)) and (start + 1 in again) == (max(before) > start)
    assert [after[s] for s in again] == [before[s] for s in again]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ground_truth"]["matched"] == 1
    assert main(["check", str(run_dir)]) == 0


def test_without_pytorch_the_playbook_validates_and_plans_and_run_says_what_to_install(repo, tmp_path):
    env = environment_without("torch", tmp_path / "no-torch")

    def testbed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "testbed", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120
        )

    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode == 1 and "import of torch halted" in probe.stderr
    assert testbed("validate", PLAYBOOK).returncode == 0
    plan = testbed("plan", PLAYBOOK)
    assert plan.returncode == 0, plan.stderr
    assert "testbed-torch-train" in plan.stdout
    results = tmp_path / "results"
    run = testbed("run", PLAYBOOK, "--emulate", "--results", str(results))
    assert run.returncode == 2, run.stdout + run.stderr
    message = " ".join(run.stderr.split())
    assert f"{PLAYBOOK}: the job needs PyTorch (testbed-torch-train is a PyTorch job)" in message
    assert INSTALL in message and "Traceback" not in run.stderr
    assert not results.exists() or not any(results.iterdir())  # refused before anything started


def test_without_pytorch_the_program_itself_says_what_to_install(tmp_path):
    """On a host without PyTorch (a lab's, where the controller cannot look), the rank says so and exits 2."""
    env = {**environment_without("torch", tmp_path / "no-torch"), "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "hostside.torch_train", "--steps", "1"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "testbed-torch-train needs PyTorch on this host" in proc.stderr and INSTALL in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_pytorch_job_under_the_hosts_own_torchrun_is_refused_on_the_twin(repo, tmp_path, capsys):
    """The emulated hosts' stand-in torchrun serves no store a PyTorch worker can use (its ranks would wait until
    the step's timeout): without TESTBED_TWIN_TORCHRUN: real the run says what to add, and starts nothing.
    """
    text = (repo / RESTART).read_text()
    assert "  env: {TESTBED_TWIN_TORCHRUN: real}\n" in text
    playbook = tmp_path / "torch-failover-restart.yaml"
    playbook.write_text(text.replace("  env: {TESTBED_TWIN_TORCHRUN: real}\n", ""))
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    results = tmp_path / "results"
    code = main(["run", str(playbook), "--emulate", "--inventory", inventory, "--results", str(results)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"{playbook}: job.env: testbed-torch-train is a PyTorch job" in err
    assert "add TESTBED_TWIN_TORCHRUN: real to the job's env" in err
    assert not results.exists() or not any(results.iterdir())
