"""testbed-torch-train's in-job recovery (`--recovery in-job`): the ranks that survive a failure never exit.

Membership comes from the controller's store (hostside/membership.py): a rank waits for the first generation that
names its slot, announces the newest step whose state it holds, and forms that generation's process group in the
generation's own prefix of the store. The group resumes after the newest step any member holds; if a member holds
less (a spare, or a survivor whose last step did not complete), the lowest rank holding that step broadcasts the
model's and the optimizer's state to all (no checkpoint read). A spare (`--spare`) starts with the job: PyTorch
imported, model and optimizer built, then parked on the store until a generation names it.

A step is all-or-nothing: its one collective (the gradients and the loss, flattened into one all-reduce) completes
before the optimizer changes anything, so a rank whose step failed holds the state of the step before, and the
group redoes that step (no step lost or counted twice). Each collective is waited for in slices, woken by its own
completion or by the abort mark (AbortWatch), so a rank blocked on a peer that will never answer leaves at once
when told, and otherwise within --timeout; so is the forming of a generation's group (form_group), which gloo does
not bound when a member's address does not answer at all (a dark link). DistributedDataParallel is not used here:
its backward pass blocks in the reducer's wait for the bucket all-reduces, which nothing can interrupt on gloo
(ProcessGroupGloo.abort() does not unblock an operation in flight).

Process groups: each generation's group is a ProcessGroupGloo (ProcessGroupNCCL on CUDA) built directly on its
prefix of the store, not torch.distributed's default group: re-initialising the default group needs
destroy_process_group() first, and destroying (or merely dropping) a gloo group whose operation is still blocked
on a dead or stopped peer waits for the thread that runs it, which needs the GIL: the process hangs. So every
generation's group stays referenced until the process ends, and the process ends with os._exit (torch_train.main)
without running their destructors. An abandoned operation ends in its own thread at the group's timeout.

CUDA (`--device cuda`): the same with NCCL; on the abort mark the old communicator is aborted (NCCL's abort does
unblock operations in flight), with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (abort and raise, never kill the process).
Only the CPU path (gloo) is tested here: no GPU in the test environment.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import sys
import threading
import time
from pathlib import Path

from hostside import membership
from hostside.torch_model import EXIT_COMM, _first_line, batch, build, latest_checkpoint, save_checkpoint

DEFAULT_START_TIMEOUT_S = 300.0  # --start-timeout's default here: every rank's start-up, on a busy host


class GroupFailed(Exception):
    """The current generation's process group cannot go on: a peer died, hangs, or the generation was aborted."""


def _make_group(dist, device, store, rank: int, world: int, timeout: float):
    delta = datetime.timedelta(seconds=timeout)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = delta
        return dist.ProcessGroupNCCL(store, rank, world, options)
    return dist.ProcessGroupGloo(store, rank, world, delta)


def form_group(dist, device, store, rank: int, world: int, generation: int, watch, wake, timeout: float, kept: list):
    """Generation `generation`'s process group, built on a thread of its own and waited for until built, aborted
    or `timeout`: gloo's connections to the members are not bounded by the group's timeout when a member's data
    address does not answer at all (a dark link drops the connection's SYNs, and the kernel retries them for
    minutes). A group still forming when this gives up stays referenced in `kept` (the module says why).
    """
    done = threading.Event()
    made: list = []  # the group, or the error that ended its forming

    def build() -> None:
        try:
            made.append(_make_group(dist, device, store, rank, world, timeout))
        except RuntimeError as exc:
            made.append(exc)
        done.set()
        wake.set()

    kept.append(made)
    threading.Thread(target=build, name=f"form-gen{generation}", daemon=True).start()
    what = f"process group of generation {generation}"
    deadline = time.monotonic() + timeout
    while not done.is_set():  # re-checked after every wake, as Collectives.finish does
        if watch.aborted(generation):
            raise GroupFailed(f"{what} not formed: generation {generation} was aborted")
        left = deadline - time.monotonic()
        if left <= 0:
            raise GroupFailed(f"{what} not formed within {timeout:g} s: a member did not connect")
        wake.wait(left)
        wake.clear()
    if isinstance(made[0], RuntimeError):
        raise GroupFailed(f"{what} not formed: {_first_line(made[0])}")
    return made[0]


class Collectives:
    """One generation's process group, each operation waited for until done, aborted or past the bound."""

    def __init__(self, dist, group, generation: int, watch: membership.AbortWatch, wake: threading.Event, timeout):
        self.dist, self.group, self.generation = dist, group, generation
        self.watch, self.wake, self.timeout = watch, wake, timeout

    def finish(self, work, what: str) -> None:
        done = threading.Event()

        def completed(_future) -> None:
            done.set()
            self.wake.set()

        work.get_future().add_done_callback(completed)
        deadline = time.monotonic() + self.timeout
        while not done.is_set():  # re-checked after every wake: a wake between the check and the wait is not lost
            if self.watch.aborted(self.generation):
                raise GroupFailed(f"{what}: generation {self.generation} was aborted")
            left = deadline - time.monotonic()
            if left <= 0:
                raise GroupFailed(f"{what}: a peer did not answer within {self.timeout:g} s")
            self.wake.wait(left)
            self.wake.clear()
        try:
            work.wait()
        except RuntimeError as exc:  # gloo's / NCCL's error: a peer closed its connection or the group timed out
            raise GroupFailed(f"{what}: {_first_line(exc)}") from None

    def all_reduce(self, tensor, what: str) -> None:
        self.finish(self.group.allreduce([tensor]), what)

    def broadcast(self, tensor, root: int, what: str) -> None:
        options = self.dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        self.finish(self.group.broadcast([tensor], options), what)

    def abort(self) -> None:
        """Unblock what is in flight where the backend can (NCCL); a gloo group is left as it is (see the module)."""
        if hasattr(self.group, "abort") and "NCCL" in type(self.group).__name__:
            self.group.abort()


def share_state(torch, comm: Collectives, source: int, rank: int, student, optimizer, device) -> dict | None:
    """Rank `source`'s model and optimizer state, broadcast to every member; None on the source itself."""
    if rank == source:
        buffer = io.BytesIO()
        torch.save({"model": student.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(device)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    comm.broadcast(size, source, "the state's size")
    if rank != source:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    comm.broadcast(data, source, "the state")
    if rank == source:
        return None
    return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), map_location=device, weights_only=True)


def train_in_job(torch, args: argparse.Namespace, say) -> int:
    import torch.distributed as dist

    if args.device == "cuda":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    device = torch.device(args.device)
    slot, timeout = args.slot, args.timeout
    start_timeout = args.start_timeout if args.start_timeout is not None else DEFAULT_START_TIMEOUT_S
    student, teacher = build(torch, args)
    student.to(device)
    teacher.to(device)
    params = list(student.parameters())
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    held = -1  # the newest step whose state this process holds (a spare: none)
    if not args.spare:
        held, path = latest_checkpoint(ckpt_dir)  # the state on disk: for when no survivor holds it
        if path is not None:
            state = torch.load(path, map_location=device, weights_only=True)
            student.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

    def fail(who: str, text: str) -> int:
        print(f"error: {who}: {text}", file=sys.stderr, flush=True)
        return EXIT_COMM

    wake = threading.Event()
    try:
        store = membership.connect(args.store, timeout)
        watch = membership.AbortWatch(membership.connect(args.store, timeout), wake.set)
    except membership.MembershipError as exc:
        return fail(f"slot {slot}", str(exc))
    groups: list[Collectives] = []  # every generation's group, never dropped (the module says why)
    forming: list[list] = []  # every group's forming, kept with it (one given up on may still complete)
    failed_last = ""  # why the generation before failed, for the error if no next one comes
    after, parked, warned, joined = -1, args.spare, False, False
    if parked:
        # the generation it waits for from (the number lets a watcher follow this line as a step: testbed's job.start)
        say(f"spare parked slot {slot} waiting for generation {after + 1}")
    while True:
        who = f"slot {slot}"
        try:
            # before its first generation a process waits for the others' start-up (PyTorch's import, the model),
            # which takes longer than a step on a busy host: --start-timeout; a parked spare waits as long as it must
            first_wait = membership.FOREVER if parked else (timeout if joined else start_timeout)
            gen = membership.next_generation(store, slot, after, first_wait)
            failed_last = ""  # said with a wait for the next generation only: a join's error names who is missing
            rank, world = gen.members[slot], gen.world_size
            who = f"rank {rank} (slot {slot})"
            # a spare named in a generation joins ranks that are up already: the step's bound, not the start's
            holds = membership.join(store, gen, rank, held, timeout if joined or args.spare else start_timeout)
        except membership.MembershipError as exc:
            return fail(who, f"{exc} ({failed_last})" if failed_last else str(exc))
        parked, joined = False, True
        args.rank = rank  # the data of the slot's rank: a spare draws the batches of the rank it replaces
        resume = max(holds.values())
        source = min(r for r, s in holds.items() if s == resume)
        try:
            watch.watch(gen.number)  # an abort mark ends the forming too
            prefix = membership.rendezvous_store(store, gen.number)
            group = form_group(dist, device, prefix, rank, world, gen.number, watch, wake, timeout, forming)
            comm = Collectives(dist, group, gen.number, watch, wake, timeout)
            groups.append(comm)
            if any(s < resume for s in holds.values()):
                state = share_state(torch, comm, source, rank, student, optimizer, device)
                if state is not None and held < resume:
                    student.load_state_dict(state["model"])
                    optimizer.load_state_dict(state["optimizer"])
                    say(f"resumed from step {resume} (state of rank {source})")
            held = resume
            if gen.number > 0 or args.spare:
                say(f"regroup rank {rank} gen {gen.number} step {resume}")
            say(f"ready rank {rank} world {world} step {resume}")
            for step in range(resume + 1, args.steps + 1):
                t0 = time.monotonic()
                if watch.aborted(gen.number):
                    raise GroupFailed(f"generation {gen.number} was aborted")
                x, y = batch(torch, args, teacher, step)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(student(x.to(device)), y.to(device))
                loss.backward()
                # one all-reduce for the step: the gradients and the loss, all-or-nothing (the module says why)
                flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
                comm.all_reduce(flat, f"step {step}'s all-reduce")
                flat.div_(world)
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
                optimizer.step()
                held = step
                say(f"step {step} loss {float(flat[-1]):.6f}")
                if ckpt_dir is not None and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                    state = {"model": student.state_dict(), "optimizer": optimizer.state_dict()}
                    save_checkpoint(torch, ckpt_dir, rank, step, state)
                if watch.store_gone and not warned:
                    print(f"warning: {who}: {watch.store_gone}: no in-job recovery", file=sys.stderr, flush=True)
                    warned = True
                left = args.step_time - (time.monotonic() - t0)
                if left > 0:
                    time.sleep(left)
            break
        except GroupFailed as exc:
            failed_last = f"generation {gen.number} failed in step {held + 1}: {exc}"
            say(f"rank {rank} gen {gen.number} failed in step {held + 1}: {exc}")
            comm_now = groups[-1] if groups and groups[-1].generation == gen.number else None
            if comm_now is not None:
                comm_now.abort()
            try:  # tell the peers not wired to the failed rank, which may be blocked until the group's timeout
                if not watch.aborted(gen.number):  # (a mark already there keeps its reason: the controller's)
                    membership.abort(store, gen.number, f"{who}: {exc}")
            except RuntimeError as gone:
                return fail(
                    who,
                    f"generation {gen.number} failed ({exc}) and the controller's store is gone: {_first_line(gone)}",
                )
            after = gen.number
    say(f"done rank {rank} steps {args.steps}")
    return 0
