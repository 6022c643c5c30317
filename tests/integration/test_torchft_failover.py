"""playbooks/torchft-failover.yaml through the CLI on the twin, as a user runs it: a real PyTorch job written in
TorchFT's loop (testbed-torchft-train, one replica group per host, TorchFT's lighthouse served by the controller)
loses a rank's GPU, or the rank's process, and the spare replica group parked since job.start joins and heals from
a live peer. Every trial is ok, the in-job milestones are measured up to the spare's first committed step, the
spare holds its peers' weights after that step, and `testbed check` finds the run sound. Without torchft the run
says what to install, as does the program itself on a host without it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from peers import environment_without, require_peer

from testbed.cli.main import main
from testbed.events import Op
from testbed.results.milestones import IN_JOB_MILESTONES

PLAYBOOK = "playbooks/torchft-failover.yaml"
INSTALL = "pip install -e '.[torchft]'"
STEP = re.compile(r"^step (\d+) loss \S+ weights (\S+)$")
# A run of three trials: about a minute on an idle 2-core machine (six Pythons importing PyTorch and torchft at
# each job.start); the margin is for a loaded one.
pytestmark = pytest.mark.timeout(600)


def _run(repo: Path, playbook: Path, trials: int, results: Path, capsys) -> Path:
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    args = ["run", str(playbook), "--emulate", "--trials", str(trials), "--inventory", inventory]
    code = main([*args, "--results", str(results)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return Path(out.out.strip().splitlines()[-1].removeprefix("results: "))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _committed(lines: list[str]) -> dict[int, str]:
    """step -> the weights digest a replica group printed after committing it."""
    return {int(m[1]): m[2] for m in map(STEP.match, lines) if m}


def _assert_every_trial_healed_the_spare(run_dir: Path, trials: int) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["trials"] == {"planned": trials, "ok": trials, "failed": 0}
    events = _jsonl(run_dir / "events.jsonl")
    truth = _jsonl(run_dir / "twin_truth.jsonl")
    for trial in range(trials):
        mine = [e for e in events if e.get("trial") == trial]
        marks = {e["op"] for e in mine if e["type"] == "mark"}
        assert set(IN_JOB_MILESTONES) <= marks and Op.JOB_RELAUNCHED not in marks
        measured = {e["op"] for e in mine if e["type"] == "measure"}
        assert {"failover.detect", "failover.publish", "failover.ready", "failover.first_step"} <= measured
        assert "failover.total" in measured
        # job.start started the four replica groups and a parked spare on each spare host; the failover nothing
        starts = [e for e in mine if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
        assert sorted(s["device"] for s in starts) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09", "gpu10"]
        assert {s["step"] for s in starts} == {"start job"}
        (published,) = [e for e in mine if e["op"] == Op.GENERATION_PUBLISHED]
        (resumed,) = [e for e in mine if e["op"] == "failover.resumed"]
        spare, rank, failed = resumed["device"], resumed["data"]["rank"], published["data"]["slot"]
        assert published["data"] == {"generation": 1, "slot": failed, "spare": spare, "rank": rank}

        jobs = {s["device"]: s["data"]["name"] for s in starts}

        def lines_of(host: str, jobs: dict[str, str] = jobs) -> list[str]:
            return [r["line"] for r in truth if r.get("event") == "line" and r["job"] == jobs[host]]

        spare_lines = lines_of(spare)
        start = resumed["data"]["resumed_from"]
        # warm: parked before the fault, its ready line (first quorum, healed to the survivors' step) after it
        ready = next(i for i, line in enumerate(spare_lines) if line.startswith(f"ready rank {rank} world "))
        assert spare_lines.index(f"spare parked slot {spare} waiting for generation 0") < ready
        assert spare_lines[ready].endswith(f" step {start}") and start > 0
        # the spare's first committed step, recorded as first_step, is the step after the one it healed to, and
        # its weights after it are every survivor's after the same step: it received the state from a live peer
        spare_steps = _committed(spare_lines)
        assert resumed["data"]["step"] == min(spare_steps) == start + 1
        survivors = [s["device"] for s in starts if s["device"] not in (failed, "gpu09", "gpu10")]
        assert len(survivors) == 3
        for host in survivors:
            theirs = _committed(lines_of(host))
            together = set(theirs) & set(spare_steps)  # the playbook's job.measure: five steps after the failover
            assert together and max(theirs) > start + 1  # the survivors trained on with the spare (none crashed)
            for step in together:
                assert theirs[step] == spare_steps[step], (host, step)
    assert main(["check", str(run_dir)]) == 0


def test_a_torchft_job_fails_over_to_a_parked_spare_that_heals_from_a_live_peer(ray_cluster, repo, tmp_path, capsys):
    """gpu.fail on a random rank, three trials in one run: every one ok."""
    require_peer("torchft", "the TorchFT job (testbed-torchft-train) needs torchft 0.2.0: pip install -e '.[torchft]'")
    run_dir = _run(repo, repo / PLAYBOOK, 3, tmp_path / "r", capsys)
    _assert_every_trial_healed_the_spare(run_dir, 3)


def test_a_killed_replica_group_is_replaced_the_same_way(ray_cluster, repo, tmp_path, capsys):
    """process.kill (SIGKILL of the rank's process) in place of gpu.fail, two trials."""
    require_peer("torchft", "the TorchFT job (testbed-torchft-train) needs torchft 0.2.0: pip install -e '.[torchft]'")
    playbook = yaml.safe_load((repo / PLAYBOOK).read_text())
    (failover,) = [s for s in playbook["steps"] if s["action"] == "failover"]
    failover["fault"] = {"kind": "process.kill"}
    path = tmp_path / "torchft-kill.yaml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    run_dir = _run(repo, path, 2, tmp_path / "r", capsys)
    _assert_every_trial_healed_the_spare(run_dir, 2)


def test_without_torchft_the_run_says_what_to_install_and_starts_nothing(repo, tmp_path):
    env = environment_without("torchft", tmp_path / "no-torchft")

    def testbed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "testbed", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120
        )

    assert testbed("validate", PLAYBOOK).returncode == 0
    results = tmp_path / "results"
    run = testbed("run", PLAYBOOK, "--emulate", "--results", str(results))
    assert run.returncode == 2, run.stdout + run.stderr
    message = " ".join(run.stderr.split())
    refusal = f"{PLAYBOOK}: job.torchft: the controller serves TorchFT's lighthouse, and torchft is not installed"
    assert refusal in message
    assert INSTALL in message and "Traceback" not in run.stderr
    assert not results.exists() or not any(results.iterdir())  # refused before anything started


def test_without_torchft_the_program_itself_says_what_to_install(tmp_path):
    """On a host without torchft (a lab's, where the controller cannot look), the rank says so and exits 2."""
    env = {
        **environment_without("torchft", tmp_path / "no-torchft"),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "TESTBED_STORE": "127.0.0.1:1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "hostside.torchft_train", "--steps", "1"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "testbed-torchft-train needs PyTorch and torchft on this host" in proc.stderr
    assert "pip install 'testbed[torchft]'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_lighthouse_that_cannot_listen_says_where_and_why(repo):
    """The controller's lighthouse on an address this machine does not have: a StepFailed naming the address and
    the lighthouse's own error.
    """
    require_peer("torchft", "the lighthouse is torchft's: pip install -e '.[torchft]'")
    from testbed.config.sections import JobTorchFT
    from testbed.contracts.errors import StepFailed
    from testbed.engine.job.lighthouse import Lighthouse

    lighthouse = Lighthouse("127.0.0.1", JobTorchFT(), ranks=4)  # one that can, for comparison
    assert lighthouse.port > 0
    lighthouse.close()
    with pytest.raises(StepFailed) as failed:
        Lighthouse("192.0.2.1", JobTorchFT(), ranks=4)  # TEST-NET-1: no host has it
    message = str(failed.value)
    assert "TorchFT's lighthouse did not start on 192.0.2.1:0" in message and "Cannot assign requested" in message
