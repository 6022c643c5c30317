"""testbed-torch-train: a small real PyTorch job, DistributedDataParallel over gloo, on synthetic data.

Each rank trains the same two-layer perceptron (DistributedDataParallel: gloo all-reduces the gradients in the
backward pass) to classify points labelled by a fixed random "teacher" network of the same shape; the data are
drawn afresh for every rank and step from (seed, rank, step), so a resumed run sees the batches it would have
seen. Every rank prints testbed-train's lines: `ready rank R world W step S` once the process group is up and
the resume point agreed, then `step N loss L` (flushed, the same L on every rank: the mean over the ranks) after
each optimizer step. Those are the lines testbed follows (job_ready, first_step; docs/jobs.md).

Checkpoints: every K steps each rank writes the model's and the optimizer's state (torch.save, written to a
temporary file and renamed) into TESTBED_CHECKPOINT_DIR, keeping its last three. On start the ranks agree on
the newest checkpoint any of them holds and its holder sends it to the others, so a spare that holds none
resumes with the rest.

Recovery (`--recovery`): `restart` (the default) is the above: the process group is set up by env://
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), torchrun's contract and the direct launcher's, and a peer that dies
or hangs makes the others exit 3 within --timeout, to be restarted from the newest checkpoint. `in-job`
(hostside/torch_injob.py) keeps the survivors running: membership comes in generations from the controller's
store (--store / TESTBED_STORE, hostside/membership.py), a spare (`--spare`) waits parked with its model built,
and a failure is repaired by a new generation with the spare in the failed slot, the state broadcast from a
survivor.

It runs on the CPU build of PyTorch (gloo); `--device cuda` uses NCCL (untested here: no GPU). PyTorch is imported
in `main` only: without it the program says what to install and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

from hostside.torch_model import (
    EXIT_COMM,
    _first_line,
    add_model_arguments,
    batch,
    build,
    latest_checkpoint,
    save_checkpoint,
)

PROG = "testbed-torch-train"
EXIT_NO_TORCH = 2
INSTALL = (
    "pip install 'testbed[torch]' (or PyTorch alone; its CPU build is enough: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_model_arguments(p, "rank")
    p.add_argument("--checkpoint-dir", default=env.get("TESTBED_CHECKPOINT_DIR"))
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0, help="minimum seconds per step (models compute)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a collective waits for a peer")
    p.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads (one rank per CPU here)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: NCCL (untested here)")
    p.add_argument(
        "--recovery",
        choices=("restart", "in-job"),
        default=env.get("TESTBED_RECOVERY", "restart"),
        help="restart: a failure ends every rank (relaunched from a checkpoint); in-job: the survivors regroup "
        "(default: TESTBED_RECOVERY, which testbed sets with the job's `recovery: in-job`, else restart)",
    )
    p.add_argument(
        "--spare",
        action="store_true",
        default=env.get("TESTBED_SPARE") == "1",
        help="in-job: start parked, until a generation names --slot (default: TESTBED_SPARE=1)",
    )
    p.add_argument("--slot", default=env.get("TESTBED_SLOT"), help="in-job: this process's slot (default rankR)")
    p.add_argument("--store", default=env.get("TESTBED_STORE"), help="in-job: the controller's TCPStore, host:port")
    p.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        help="seconds a rank waits for the others to start: the process group's set-up and the resume point "
        "(in-job: the first generation; default 300); every wait after it: --timeout (restart: the default)",
    )
    p.add_argument(
        "--log",
        default=env.get("TESTBED_RANK_LOG"),
        help="write this rank's output to this file ({rank}: the rank) instead of stdout and stderr",
    )
    args = p.parse_args(argv)
    if args.recovery not in ("restart", "in-job"):  # from TESTBED_RECOVERY, which argparse's choices do not check
        p.error(f"TESTBED_RECOVERY={args.recovery!r}: restart or in-job")
    args.rank = int(env.get("RANK", "0"))
    args.world_size = int(env.get("WORLD_SIZE", "1"))
    if not 0 <= args.rank < args.world_size:
        p.error(f"RANK {args.rank} and WORLD_SIZE {args.world_size} do not fit")
    if args.recovery == "restart" and args.spare:
        p.error("--spare needs --recovery in-job (a spare of the restart mode is a rank started in the failed slot)")
    if args.recovery == "in-job":
        if not args.store:
            p.error("--recovery in-job needs the controller's store: --store HOST:PORT or TESTBED_STORE")
        if args.spare and not args.slot:
            p.error("--spare needs its slot: --slot NAME or TESTBED_SLOT (the name the controller will publish)")
        args.slot = args.slot or f"rank{args.rank}"
    return args


def train(torch, args: argparse.Namespace, say) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = args.rank, args.world_size
    timeout = datetime.timedelta(seconds=args.timeout)
    # The start (the rendezvous, the full mesh, the resume point) waits for the slowest rank to import PyTorch
    # and build its model, which a busy host stretches well past the bound a step's collective may take.
    start_timeout = datetime.timedelta(seconds=args.start_timeout if args.start_timeout is not None else args.timeout)
    device = torch.device(args.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=start_timeout)
    except (RuntimeError, ValueError) as exc:  # DistNetworkError / DistStoreError are RuntimeErrors
        print(f"error: rank {rank}: {backend} process group not set up: {_first_line(exc)}", file=sys.stderr)
        return EXIT_COMM
    step, model = 0, None
    try:
        student, teacher = build(torch, args)
        student.to(device)
        teacher.to(device)
        optimizer = torch.optim.SGD(student.parameters(), lr=args.lr, momentum=0.9)
        ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
        # Agree on where to resume: the newest checkpoint any rank holds; its holder sends it to the others.
        mine, path = latest_checkpoint(ckpt_dir)
        steps = torch.zeros(world, dtype=torch.int64, device=device)
        steps[rank] = mine
        dist.all_reduce(steps)
        start = int(steps.max())
        if start > 0:
            source = int(torch.nonzero(steps == start)[0])
            box: list[Any] = [torch.load(path, map_location=device, weights_only=True) if rank == source else None]
            dist.broadcast_object_list(box, src=source)
            student.load_state_dict(box[0]["model"])
            optimizer.load_state_dict(box[0]["optimizer"])
            say(f"resumed from step {start} (checkpoint of rank {source})")
        # The steps' collectives in a group of their own with the step's bound (a group's timeout is fixed when it
        # is made); the same group when both bounds are one.
        steps_group = dist.new_group(timeout=timeout) if start_timeout != timeout else None
        device_ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(student, device_ids=device_ids, process_group=steps_group)
        loss_fn = torch.nn.CrossEntropyLoss()
        say(f"ready rank {rank} world {world} step {start}")
        for step in range(start + 1, args.steps + 1):
            t0 = time.monotonic()
            x, y = batch(torch, args, teacher, step)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()  # DDP's gloo all-reduce of the gradients
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=steps_group)  # a step's collective: the step's bound, as DDP's
            say(f"step {step} loss {float(mean) / world:.6f}")
            if ckpt_dir is not None and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                state = {"model": student.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(torch, ckpt_dir, rank, step, state)
            spare = args.step_time - (time.monotonic() - t0)
            if spare > 0:
                time.sleep(spare)
    except RuntimeError as exc:  # gloo's errors (DistBackendError ...): a peer died or stopped answering
        print(
            f"error: rank {rank}: step {step} failed, a peer is gone or did not answer within {args.timeout:g} s: "
            f"{_first_line(exc)}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_COMM
    finally:
        # DDP holds the process group: dropped (and its reference cycles collected) first, so that destroying the
        # group ends gloo's threads now; a group still alive at the interpreter's exit can abort the process there
        # ("terminate called without an active exception") after the job has done its work.
        model = None
        gc.collect()
        with contextlib.suppress(Exception):  # the group may be broken already: nothing left to tear down
            dist.destroy_process_group()
    say(f"done rank {rank} steps {args.steps}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.log:
        from hostside.train import _to_log

        _to_log(args.log, args.rank)

    def say(line: str) -> None:
        print(line, flush=True)

    local = os.environ.get("LOCAL_RANK")
    local = "" if local is None else f" local_rank={local}"
    say(
        f"rank {args.rank}/{args.world_size} starting pid {os.getpid()} "
        f"cuda_visible_devices={os.environ.get('CUDA_VISIBLE_DEVICES')}{local}"
    )
    try:
        import torch
    except ImportError as exc:
        print(f"error: {PROG} needs PyTorch on this host ({exc}): {INSTALL}", file=sys.stderr, flush=True)
        return EXIT_NO_TORCH
    torch.set_num_threads(max(1, args.threads))
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: rank {args.rank}: --device cuda but PyTorch sees no CUDA device", file=sys.stderr, flush=True)
        return EXIT_NO_TORCH
    if args.recovery == "restart":
        return train(torch, args, say)
    from hostside.torch_injob import train_in_job

    code = train_in_job(torch, args, say)
    # Every generation's process group is still referenced, some perhaps with an operation blocked on a dead peer:
    # their destructors would wait for it (hostside/torch_injob.py), so the process leaves without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
