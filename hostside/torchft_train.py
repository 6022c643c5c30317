"""testbed-torchft-train: the real PyTorch job of testbed-torch-train written in TorchFT's loop (`job.torchft`).

Each process is one TorchFT replica group of world size 1: its own TCPStore, a `torchft.Manager` over
`torchft.ProcessGroupGloo`, `torchft.Optimizer` around SGD, and the model, data and lines of testbed-torch-train
(hostside/torch_model.py): `ready rank R world W step S` once its first quorum is formed (W: the replica groups
in it, a group that heals not counted; S: the step it starts from, a live peer's on a group that healed), then
`step N loss L weights D` after each step that committed (L the mean over the groups; D the sum of the model's
parameters, the same on every group after the same step: a healed spare holds its peers' state). A step that did
not commit (a peer died or hung during it) prints `rank R step N not committed (W groups)` and is redone with the
next quorum.

The gradients and the loss are averaged in one `manager.allreduce(...).wait()` after the backward pass:
torchft 0.2.0's DistributedDataParallel crashes a surviving group when a peer dies during a step (its comm hook
asserts; docs/interop.md, "TorchFT"), while its allreduce reports the failure to the Manager and the step just
does not commit.

Membership is TorchFT's: the lighthouse (served by testbed for each job.start, `job.torchft`) forms a quorum of
the groups alive at every step. testbed's in-job store (TESTBED_STORE, hostside/membership.py) serves only two
things here: the lighthouse's port (key `torchft/lighthouse`; its address is the store's), and the parking of a
spare (TESTBED_SPARE=1), which imports PyTorch and TorchFT and builds its model, prints `spare parked slot X
waiting for generation G`, and starts its Manager only when the controller publishes a generation naming its
slot. A parked spare must stay out of the lighthouse: a group that heartbeats but never asks for a quorum makes
every quorum wait for it, and one that joined would train as one more group. Once named, it takes the failed
slot's rank (so its data are that rank's), joins, and TorchFT heals it from a live peer (the model's and the
optimizer's state and the step over its HTTP checkpoint transport); its first committed step is printed as
every step is.

Needs PyTorch and torchft (pip install 'testbed[torchft]'), imported in `main` only: without them the program
says what to install and exits 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from hostside import membership
from hostside.torch_model import EXIT_COMM, _first_line, add_model_arguments, batch, build

PROG = "testbed-torchft-train"
EXIT_NO_TORCHFT = 2
INSTALL = "pip install 'testbed[torchft]' (PyTorch with torchft 0.2.0; the CPU build is enough)"
LIGHTHOUSE_KEY = "torchft/lighthouse"  # the lighthouse's port, in the controller's store (testbed sets it)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_model_arguments(p, "group")
    p.add_argument("--step-time", type=float, default=0.0, help="minimum seconds per step (models compute)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a collective or a quorum waits for a peer")
    p.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds the first quorum waits (every group's start-up)"
    )
    p.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads")
    p.add_argument(
        "--min-replicas",
        type=int,
        default=None,
        help="replica groups a step needs to commit (default: WORLD_SIZE - 1, at least 1: one group may fail)",
    )
    p.add_argument("--store", default=env.get("TESTBED_STORE"), help="the controller's store, host:port")
    p.add_argument("--slot", default=env.get("TESTBED_SLOT"), help="this process's slot (default rankR)")
    p.add_argument(
        "--spare",
        action="store_true",
        default=env.get("TESTBED_SPARE") == "1",
        help="start parked, until a generation names --slot (default: TESTBED_SPARE=1)",
    )
    args = p.parse_args(argv)
    args.rank = int(env.get("RANK", "0"))
    args.world_size = int(env.get("WORLD_SIZE", "1"))
    if not 0 <= args.rank < args.world_size:
        p.error(f"RANK {args.rank} and WORLD_SIZE {args.world_size} do not fit")
    if not args.store:
        p.error(
            "needs the controller's store (the lighthouse's port, a spare's parking): --store HOST:PORT or "
            "TESTBED_STORE, which testbed sets with the job's `torchft:`"
        )
    if args.spare and not args.slot:
        p.error("--spare needs its slot: --slot NAME or TESTBED_SLOT (the name the controller will publish)")
    args.slot = args.slot or f"rank{args.rank}"
    if args.min_replicas is None:
        args.min_replicas = max(1, args.world_size - 1)
    return args


def local_address_towards(host: str) -> str:
    """This host's address on the route to `host` (the controller): where the other groups reach this group's store
    and checkpoint server, as they reach the controller. A UDP "connect" only picks the route; nothing is sent.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def train(torch, torchft, args: argparse.Namespace, say) -> int:
    from datetime import timedelta

    store = membership.connect(args.store, args.timeout)
    student, teacher = build(torch, args)
    sgd = torch.optim.SGD(student.parameters(), lr=args.lr, momentum=0.9)
    if args.spare:
        say(f"spare parked slot {args.slot} waiting for generation 0")
        generation = membership.next_generation(store, args.slot, -1, membership.FOREVER)
        args.rank = generation.members[args.slot]  # the failed slot's rank: its data stream
    store_host = args.store.rpartition(":")[0].strip("[]")
    lighthouse = f"http://{store_host}:{int(store.get(LIGHTHOUSE_KEY))}"
    hostname = local_address_towards(store_host)
    own_store = torch.distributed.TCPStore(hostname, 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, object]:
        return {"model": student.state_dict(), "optimizer": sgd.state_dict()}

    def load_state_dict(state: dict) -> None:
        student.load_state_dict(state["model"])
        sgd.load_state_dict(state["optimizer"])

    timeout = timedelta(seconds=args.timeout)
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replicas,
        timeout=timeout,
        # the first quorum waits for every group's start (PyTorch's import on a busy host); a spare's for its heal
        quorum_timeout=timedelta(seconds=args.start_timeout),
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=hostname,
        store_port=own_store.port,
        lighthouse_addr=lighthouse,
        replica_id=args.slot,
        hostname=hostname,
    )
    optimizer = torchft.Optimizer(manager, sgd)
    loss_fn = torch.nn.CrossEntropyLoss()
    sizes = [p.numel() for p in student.parameters()]
    ready = False
    while manager.current_step() < args.steps:
        t0 = time.monotonic()
        optimizer.zero_grad(set_to_none=True)  # starts this step's quorum (a joining group heals in it)
        try:
            manager.wait_quorum()
        except Exception as exc:  # the lighthouse did not form a quorum in time: nothing to train with
            print(f"error: rank {args.rank} (slot {args.slot}): no quorum: {_first_line(exc)}", file=sys.stderr)
            return EXIT_COMM
        step = manager.current_step() + 1
        if not ready:
            say(f"ready rank {args.rank} world {manager.num_participants()} step {step - 1}")
            ready = True
        x, y = batch(torch, args, teacher, step)
        loss = loss_fn(student(x), y)
        loss.backward()
        # one collective per step, the gradients and the loss together: a failure leaves the step whole or undone
        flat = torch.cat([*(p.grad.reshape(-1) for p in student.parameters()), loss.detach().reshape(1)])
        manager.allreduce(flat).wait()  # torchft's Work reports a failed allreduce to the Manager, never raises
        for p, g in zip(student.parameters(), flat[:-1].split(sizes), strict=True):
            p.grad.copy_(g.view_as(p))
        before = manager.current_step()
        optimizer.step()  # steps SGD only if every group's should_commit said yes, and counts the step
        if manager.current_step() > before:
            weights = float(sum(p.detach().double().sum() for p in student.parameters()))
            say(f"step {manager.current_step()} loss {float(flat[-1]):.6f} weights {weights:.12g}")
        else:
            say(f"rank {args.rank} step {step} not committed ({manager.num_participants()} groups)")
        rest = args.step_time - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
    say(f"done rank {args.rank} steps {args.steps}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"rank {args.rank}/{args.world_size} starting pid {os.getpid()} slot {args.slot}")
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO: one line a step
    try:
        import torch
        import torchft  # type: ignore[import-untyped]  # torchft ships no type information
    except ImportError as exc:
        print(f"error: {PROG} needs PyTorch and torchft on this host ({exc}): {INSTALL}", file=sys.stderr, flush=True)
        return EXIT_NO_TORCHFT
    torch.set_num_threads(max(1, args.threads))
    try:
        code = train(torch, torchft, args, say)
    except membership.MembershipError as exc:  # the controller's store gone, or a wait on it ran out
        print(f"error: rank {args.rank} (slot {args.slot}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_COMM
    # The Manager's threads and the process group may still wait on a dead peer: their destructors would wait too
    # (as testbed-torch-train's in-job mode), so the process leaves without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
