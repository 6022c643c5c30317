"""In-job recovery of the real PyTorch job (testbed-torch-train --recovery in-job, hostside/torch_injob.py): real
processes, real torch on gloo, the test as the controller holding the store (hostside/membership.py).

A rank dies (kill -9) or hangs (SIGSTOP) mid-training; the test publishes the next generation with the parked
spare in its slot; the survivors never exit, the spare receives the state from a survivor, and the final
parameters equal, bit for bit, those of an uninterrupted run: the data are drawn per (seed, rank, step), a failed
step is redone whole, and the same three ranks sum the same gradients in the same order.

The kill comes at the victim's second step of ten, each of them at least --step-time long: the victim cannot finish
the run before it (its exit status is asserted: -9, not 0).
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from peers import require_peer

from hostside import membership
from hostside.torch_train import parse_args

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
STEPS = 10
TIMEOUT = 8  # --timeout: the bounds after the start (a hung peer, a missing spare, a generation not published)
JOB = ["--steps", str(STEPS), "--dim", "8", "--hidden", "16", "--batch", "16", "--step-time", "0.15"]
JOB += ["--checkpoint-every", str(STEPS), "--timeout", str(TIMEOUT), "--recovery", "in-job"]
SLOTS = {"host0": 0, "host1": 1, "host2": 2}


class Proc:
    """One process of the job, its output (stdout and stderr) collected line by line as it comes."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], argv0: list[str] | None = None) -> None:
        self.name = name
        self.lines: list[str | None] = []
        self._seen = threading.Condition()
        self.popen = subprocess.Popen(
            [*(argv0 or [sys.executable, "-m", "hostside.torch_train"]), *argv],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self.lines.append(None)  # the end of the output
            self._seen.notify_all()

    def wait_line(self, pattern: str, timeout: float = 120) -> re.Match:
        """The first line matching `pattern` (waiting for it as it is printed); fails if the output ends first."""
        regex = re.compile(pattern)

        def found() -> re.Match | bool | None:  # the match; False: the output ended without one; None: not yet
            for line in self.lines:
                if line is None:
                    return False
                if m := regex.fullmatch(line):
                    return m
            return None

        with self._seen:
            self._seen.wait_for(lambda: found() is not None, timeout)
            m = found()
        assert m, f"{self.name}: no line {pattern!r} in:\n" + self.output()
        return m

    def finish(self, timeout: float = 120) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(timeout)
        return code

    def output(self) -> str:
        return "\n".join(line for line in self.lines if line is not None)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


class Controller:
    """The test's side: the store's server and the job's processes."""

    def __init__(self, tmp: Path) -> None:
        import torch.distributed as dist

        self.tmp = tmp
        self.store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
        )
        self.generation = membership.Generation(0, dict(SLOTS))
        membership.publish(self.store, self.generation)
        self.procs: dict[str, Proc] = {}

    def start(self, slot: str, spare: bool = False, slots: dict[str, int] = SLOTS, extra: tuple[str, ...] = ()) -> Proc:
        env = {
            "TESTBED_STORE": f"127.0.0.1:{self.store.port}",
            "TESTBED_SLOT": slot,
            "TESTBED_CHECKPOINT_DIR": str(self.tmp / slot),
            "RANK": str(slots.get(slot, 0)),
            "WORLD_SIZE": str(len(slots)),
        }
        proc = Proc(slot, [*JOB, *extra, *(["--spare"] if spare else [])], env)
        self.procs[slot] = proc
        return proc

    def replace(self, failed: str, spare: str) -> None:
        self.generation = self.generation.replaced(failed, spare)
        membership.publish(self.store, self.generation, f"{failed} lost")

    def final_params(self, slot: str, rank: int) -> dict:
        import torch

        return torch.load(self.tmp / slot / f"ckpt-rank{rank}-step{STEPS}.pt", weights_only=True)["model"]

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stop()


@pytest.fixture
def controller(tmp_path):
    require_peer("torch", "testbed-torch-train is a PyTorch job")
    c = Controller(tmp_path)
    yield c
    c.close()


def _losses(proc: Proc) -> dict[int, str]:
    return {int(m[1]): m[2] for line in proc.lines if line and (m := re.fullmatch(r"step (\d+) loss (\S+)", line))}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Three ranks to the end with no failure: their losses and rank 0's final parameters."""
    require_peer("torch", "testbed-torch-train is a PyTorch job")
    c = Controller(tmp_path_factory.mktemp("uninterrupted"))
    try:
        ranks = [c.start(slot) for slot in SLOTS]
        assert [p.finish() for p in ranks] == [0, 0, 0], "\n".join(p.output() for p in ranks)
        losses = _losses(ranks[0])
        assert sorted(losses) == list(range(1, STEPS + 1))
        return losses, c.final_params("host0", 0)
    finally:
        c.close()


def _assert_equal(params: dict, expected: dict) -> None:
    import torch

    assert params.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(params[name], tensor), name


def _recovers(controller: Controller, uninterrupted, fault: signal.Signals) -> None:
    """Three ranks and a spare; rank 1 gets `fault` at its second step; the spare takes its slot and the job ends
    as the uninterrupted one did.
    """
    losses, expected = uninterrupted
    ranks = {slot: controller.start(slot) for slot in SLOTS}
    spare = controller.start("spare0", spare=True)
    spare.wait_line("spare parked slot spare0 waiting for generation 0")
    victim = ranks["host1"]
    victim.wait_line("step 2 loss .*")
    victim.popen.send_signal(fault)
    if fault == signal.SIGSTOP:
        # every survivor's collective waits on the stopped rank: within --timeout they say so and mark generation 0
        # aborted, and wait (within --timeout too) for the controller's next generation
        for slot in ("host0", "host2"):
            ranks[slot].wait_line(rf"rank {SLOTS[slot]} gen 0 failed in step \d+: .*")
        victim.popen.kill()
    assert victim.finish() == -signal.SIGKILL, victim.output()  # it died mid-training: it had not finished
    controller.replace("host1", "spare0")

    survivors = [ranks["host0"], ranks["host2"]]
    for proc in [*survivors, spare]:
        assert proc.finish() == 0, proc.output()
    resumed = {int(p.wait_line(r"regroup rank \d gen 1 step (\d+)")[1]) for p in [*survivors, spare]}
    assert len(resumed) == 1  # one step to resume at, agreed by all
    (step,) = resumed
    assert 2 <= step < STEPS
    spare.wait_line(f"ready rank 1 world 3 step {step}")
    spare.wait_line(rf"resumed from step {step} \(state of rank [02]\)")
    for proc in survivors:
        assert f"ready rank {SLOTS[proc.name]} world 3 step {step}" in proc.lines
    assert _losses(spare) == {s: losses[s] for s in range(step + 1, STEPS + 1)}
    for proc in survivors:
        assert _losses(proc) == losses  # every step once, the failed one redone, the same mean loss
    for slot, rank in (("host0", 0), ("host2", 2), ("spare0", 1)):
        _assert_equal(controller.final_params(slot, rank), expected)


def test_a_killed_rank_is_replaced_by_the_parked_spare_and_training_ends_as_if_uninterrupted(controller, uninterrupted):
    _recovers(controller, uninterrupted, signal.SIGKILL)


def test_a_hung_rank_is_given_up_within_the_bound_and_replaced(controller, uninterrupted):
    _recovers(controller, uninterrupted, signal.SIGSTOP)


def test_a_spare_that_never_arrives_ends_the_survivors_with_an_error_naming_its_slot(controller):
    ranks = {slot: controller.start(slot) for slot in SLOTS}
    ranks["host1"].wait_line("step 2 loss .*")
    ranks["host1"].popen.kill()
    assert ranks["host1"].finish() == -signal.SIGKILL
    controller.replace("host1", "spare0")  # named, never started
    for slot in ("host0", "host2"):
        assert ranks[slot].finish() == 3
        ranks[slot].wait_line(
            rf"error: rank {SLOTS[slot]} \(slot {slot}\): generation 1: slot spare0 \(rank 1\) did not join "
            rf"within {TIMEOUT} s"
        )


def test_a_parked_spare_whose_store_goes_ends_with_an_error_naming_its_slot(tmp_path):
    require_peer("torch", "testbed-torch-train is a PyTorch job")
    holder = subprocess.Popen(  # the controller's store in a process of its own, to be killed
        [
            sys.executable,
            "-c",
            "import sys, torch.distributed as d\n"
            "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
            "print(s.port, flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(holder.stdout.readline())
        spare = Proc("spare0", [*JOB, "--spare"], {"TESTBED_STORE": f"127.0.0.1:{port}", "TESTBED_SLOT": "spare0"})
        spare.wait_line("spare parked slot spare0 waiting for generation 0")
        holder.kill()
        assert spare.finish() == 3
        spare.wait_line(r"error: slot spare0: the controller's store is gone: .*")
    finally:
        holder.kill()
        holder.wait()


def test_the_membership_keys_skip_aborted_generations_and_name_who_did_not_join():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    g0 = membership.Generation(0, {"a": 0, "b": 1})
    membership.publish(store, g0)
    g1 = g0.replaced("b", "c")
    assert g1.members == {"a": 0, "c": 1}
    membership.publish(store, g1)
    membership.publish(store, g1.replaced("c", "d"))
    assert store.check([membership.abort_key(0), membership.abort_key(1)])
    assert store.get(membership.GENERATION) == b"2"
    # "a" is in every generation; the first not aborted is 2
    assert membership.next_generation(store, "a", -1, 5).number == 2
    with pytest.raises(membership.MembershipError, match="generation 3 was not published within 0.1 s"):
        membership.next_generation(store, "a", 2, 0.1)
    with pytest.raises(membership.MembershipError, match=r"generation 2: slot d \(rank 1\) did not join within 0.1"):
        membership.join(store, membership.read_generation(store, 2), 0, 5, 0.1)
    with pytest.raises(membership.MembershipError, match="not a member"):
        g1.replaced("b", "e")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--spare"], {}, "--spare needs --recovery in-job"),
        (["--recovery", "in-job"], {}, "needs the controller's store"),
        (["--recovery", "in-job", "--spare", "--store", "h:1"], {}, "--spare needs its slot"),
    ],
)
def test_in_job_options_missing_their_parts_are_refused_by_name(argv, env, message, capsys, monkeypatch):
    for name in ("TESTBED_STORE", "TESTBED_SLOT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_membership_module_imports_without_pytorch():
    probe = "import sys, hostside.membership; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_documented_example_script_recovers_with_a_spare(controller, tmp_path):
    """docs/jobs.md's example of a user's own script, as printed there: two ranks and a spare; rank 1 killed; the
    survivor and the spare end with the same weights (the state went from one to the other, every step in step).
    """
    text = (REPO / "docs/jobs.md").read_text()
    block = text.split("<!-- in-job-example -->\n```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(block)
    controller.generation = membership.Generation(0, {"a": 0, "b": 1})
    membership.publish(controller.store, controller.generation)  # generation 0 again, before any rank starts

    def start(slot: str, spare: bool) -> Proc:
        env = {"TESTBED_STORE": f"127.0.0.1:{controller.store.port}", "TESTBED_SLOT": slot, "PYTHONPATH": str(REPO)}
        proc = Proc(slot, [], {**env, **({"TESTBED_SPARE": "1"} if spare else {})}, argv0=[sys.executable, str(script)])
        controller.procs[slot] = proc
        return proc

    a, b, spare = start("a", False), start("b", False), start("c", True)
    b.wait_line("step 2 loss .*")
    b.popen.kill()
    assert b.finish() == -signal.SIGKILL, b.output()
    controller.replace("b", "c")
    assert a.finish() == 0, a.output()
    assert spare.finish() == 0, spare.output()
    step = spare.wait_line(r"ready rank 1 world 2 step (\d+)")[1]
    a.wait_line(f"ready rank 0 world 2 step {step}")
    assert a.wait_line(r"weights \[.*\]")[0] == spare.wait_line(r"weights \[.*\]")[0]


def test_with_no_survivor_the_relaunched_ranks_resume_from_the_checkpoints(controller, uninterrupted):
    """Every rank lost: no survivor holds the state, so the ranks the controller starts again resume from the newest
    checkpoint on disk (one of them, a replacement host, holds none and receives it) and end as the uninterrupted
    run did.
    """
    losses, expected = uninterrupted
    every = ("--checkpoint-every", "5")
    first = {slot: controller.start(slot, extra=every) for slot in SLOTS}
    first["host0"].wait_line("step 6 loss .*")  # every rank has written its checkpoint of step 5
    for proc in first.values():
        proc.popen.kill()
        assert proc.finish() == -signal.SIGKILL, proc.output()
    shutil.rmtree(controller.tmp / "host1")  # a new host in slot host1: no checkpoint
    controller.generation = membership.Generation(1, dict(SLOTS))
    membership.publish(controller.store, controller.generation, "every rank lost")
    again = {slot: controller.start(slot, extra=every) for slot in SLOTS}
    for proc in again.values():
        assert proc.finish() == 0, proc.output()
    step = int(again["host1"].wait_line(r"resumed from step (\d+) \(state of rank [02]\)")[1])
    assert step >= 5
    assert _losses(again["host1"]) == {s: losses[s] for s in range(step + 1, STEPS + 1)}
    for slot, rank in SLOTS.items():
        _assert_equal(controller.final_params(slot, rank), expected)
