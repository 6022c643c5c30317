"""In-job recovery of the real PyTorch job against a cold restart from its checkpoint: kill -> first step on the spare.

    python bench/inplace_recovery.py [--trials 10] [--ranks 3] [--steps 400]

Needs PyTorch (pip install 'testbed[torch]'). No framework: this process is the controller (it holds the store,
starts the ranks on this machine, kills one, and sees it die as its parent), so both figures are the job's own
share of a failover. In alternating trials (the order turns every trial), a fresh job of --ranks ranks
(testbed-torch-train, gloo on the CPU, --step-time 0.02) runs until every rank has made a few steps, then rank 1
is killed (SIGKILL) and the clock starts:

- in-job (`--recovery in-job`, a spare parked from the start): the controller publishes the next generation with
  the spare in the dead rank's slot (hostside/membership.py); the survivors leave their old group, the spare
  joins and receives the state from a survivor;
- restart (`--recovery restart`, today's failover): the controller stops the survivors (SIGKILL: their teardown is
  not in the figure) and starts every rank again, the spare's in the dead one's place, env:// on a new port; they
  import PyTorch, build the model, agree on the newest checkpoint (written every step, so the resume point is the
  same as in-job's) and its holder broadcasts it.

The clock stops at the spare's first `step N loss L` line, as this process reads it from the spare's pipe.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import machine, stats, write_out

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hostside import membership  # noqa: E402

MODES = ("in-job", "restart")


class Proc:
    """A rank of the job; `seen(pattern)` waits for a line and gives the moment this process read it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "hostside.torch_train", *argv],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.ended = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def seen(self, pattern: str, timeout: float = 120) -> float:
        regex = re.compile(pattern)

        def at() -> float | None:
            return next((t for t, line in self.lines if regex.fullmatch(line)), None)

        with self._cond:
            self._cond.wait_for(lambda: at() is not None or self.ended, timeout)
            t = at()
        if t is None:
            raise RuntimeError(f"no line {pattern!r} from {self.popen.args!r}: {[line for _, line in self.lines][-5:]}")
        return t

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_args(args: argparse.Namespace, mode: str) -> list[str]:
    device = ["--device", getattr(args, "device", "cpu")]
    return ["--steps", str(args.steps), "--step-time", "0.02", "--timeout", "10", "--recovery", mode, *device]


def gpu_env(args: argparse.Namespace, slot: int) -> dict[str, str]:
    """With --device cuda, rank `slot` on GPU slot mod --gpus (NCCL wants one GPU per rank); nothing on the CPU."""
    if getattr(args, "device", "cpu") != "cuda":
        return {}
    return {"CUDA_VISIBLE_DEVICES": str(slot % max(1, getattr(args, "gpus", 1)))}


def in_job_trial(args: argparse.Namespace, tmp: Path) -> float:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    generation = membership.Generation(0, {f"host{r}": r for r in range(args.ranks)})
    membership.publish(store, generation)
    env = {"TESTBED_STORE": f"127.0.0.1:{store.port}", "WORLD_SIZE": str(args.ranks)}
    procs = [
        Proc(job_args(args, "in-job"), {**env, **gpu_env(args, r), "RANK": str(r), "TESTBED_SLOT": f"host{r}"})
        for r in range(args.ranks)
    ]
    # the spare takes the dead rank 1's GPU
    spare = Proc([*job_args(args, "in-job"), "--spare"], {**env, **gpu_env(args, 1), "TESTBED_SLOT": "spare"})
    try:
        spare.seen("spare parked slot spare waiting for generation 0")
        procs[1].seen(r"step 5 loss \S+")
        t0 = time.monotonic()
        procs[1].kill()
        membership.publish(store, generation.replaced("host1", "spare"), "host1 lost")
        return spare.seen(r"step \d+ loss \S+") - t0
    finally:
        for p in [*procs, spare]:
            p.kill()


def restart_trial(args: argparse.Namespace, tmp: Path) -> float:
    def launch(dirs: list[Path]) -> list[Proc]:
        port = str(_free_port())
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(args.ranks)}
        argv = [*job_args(args, "restart"), "--checkpoint-every", "1"]
        return [
            Proc(argv, {**env, **gpu_env(args, r), "RANK": str(r), "TESTBED_CHECKPOINT_DIR": str(d)})
            for r, d in enumerate(dirs)
        ]

    dirs = [tmp / f"rank{r}" for r in range(args.ranks)]
    procs = launch(dirs)
    relaunched: list[Proc] = []
    try:
        procs[1].seen(r"step 5 loss \S+")
        t0 = time.monotonic()
        for p in procs:  # the dead rank, then the survivors stopped, as a failover's relaunch does
            p.kill()
        dirs[1] = tmp / "spare"  # the spare holds no checkpoint: the others' holder sends it
        relaunched = launch(dirs)
        return relaunched[1].seen(r"step \d+ loss \S+") - t0
    finally:
        for p in [*procs, *relaunched]:
            p.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="trials of each mode")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=400, help="the job's --steps (long enough not to end in a trial)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="the job's --device (cuda: NCCL)")
    p.add_argument("--gpus", type=int, default=1, help="with --device cuda: rank r runs on GPU r mod GPUS")
    args = p.parse_args()
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    for trial in range(args.trials):
        order = MODES if trial % 2 == 0 else MODES[::-1]
        for mode in order:
            with tempfile.TemporaryDirectory(prefix="inplace-bench-") as tmp:
                run = in_job_trial if mode == "in-job" else restart_trial
                seconds = run(args, Path(tmp))
            samples[mode].append(seconds * 1000)
            print(f"trial {trial + 1}/{args.trials} {mode}: {seconds * 1000:.0f} ms", flush=True)
    result = {
        "what": "kill -9 of rank 1 -> the spare's first step (ms), in-job recovery against a cold restart",
        "ranks": args.ranks,
        "device": args.device,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "in_job_ms": stats(samples["in-job"]),
        "restart_ms": stats(samples["restart"]),
        "samples_ms": samples,
    }
    path = write_out("inplace_recovery", result)
    for mode, key in (("in-job", "in_job_ms"), ("restart", "restart_ms")):
        s = result[key]
        print(f"{mode:8s} n={s['n']} p50 {s['p50']:.0f} ms  min {s['min']:.0f}  max {s['max']:.0f}")
    print(f"p50 ratio restart / in-job: {result['restart_ms']['p50'] / result['in_job_ms']['p50']:.1f}x  ({path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
