"""testbed-train: the reference workload, a small real data-parallel training loop in NumPy.

Each rank fits the same linear model on its own shard of a synthetic regression problem; every step the
ranks sum their gradients (and losses) with a ring all-reduce over TCP: rank r listens on its own
peers[r] and sends to peers[(r+1) % W]. Every rank prints `step N loss L` (flushed) with the same L,
checkpoints every K steps and, on start, resumes from the newest checkpoint any rank has (ranks agree
on it, and the rank holding it sends the parameters to the others), so the step count continues.

It depends on nothing in the testbed: it runs unchanged on a lab host. Configuration comes from the
command line or the environment (RANK, WORLD_SIZE, TESTBED_PEERS="host:port,host:port,...", or a
hostfile with one host:port per line in rank order). A peer that dies or hangs makes the others exit
with status 3 and a message naming it, after at most --timeout seconds.

Started by torchrun it reads PyTorch's contract from the environment as it is (RANK, WORLD_SIZE, LOCAL_RANK;
the ring's addresses still come from TESTBED_PEERS, which torchrun passes on to its workers). With
--backend gloo it sums over torch.distributed instead of its own ring: the process group is set up by env://
(MASTER_ADDR, MASTER_PORT), so any launcher of PyTorch jobs can start it; PyTorch is imported only then.
--log FILE (TESTBED_RANK_LOG), where {rank} stands for the rank, sends the rank's output to a file of its
own: several ranks under one launcher share its output otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import selectors
import socket
import struct
import sys
import time
from pathlib import Path

# One rank drives one GPU; its NumPy work is a 64-wide vector, too small for BLAS threads to help. Started
# with the default (a thread per core), every rank start-up spends twice the CPU creating them, and on a
# shared host the ranks' threads only contend. Set before NumPy loads its BLAS; a user's own setting wins.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402 - after the BLAS thread settings above

HEADER = struct.Struct("!QIIQ")  # step, phase, chunk, payload bytes
EXIT_COMM = 3


class CommError(RuntimeError):
    pass


def parse_peers(text: str) -> list[tuple[str, int]]:
    peers = []
    for item in re.split(r"[,\s]+", text.strip()):
        if item:
            host, _, port = item.rpartition(":")
            peers.append((host or "127.0.0.1", int(port)))
    return peers


class Ring:
    """TCP ring: receive from rank-1, send to rank+1."""

    def __init__(self, rank: int, peers: list[tuple[str, int]], timeout: float, bind: str | None = None):
        self.rank, self.world, self.timeout = rank, len(peers), timeout
        self.left_rank, self.right_rank = (rank - 1) % self.world, (rank + 1) % self.world
        self.peers = peers
        if self.world == 1:
            return
        listener = socket.create_server((bind or peers[rank][0], peers[rank][1]), reuse_port=False)
        listener.settimeout(timeout)
        deadline = time.monotonic() + timeout
        host, port = peers[self.right_rank]
        while True:
            try:
                self.right = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise CommError(
                        f"rank {rank}: cannot reach rank {self.right_rank} at {host}:{port} within {timeout:g} s: {exc}"
                    ) from exc
                time.sleep(0.05)  # the peer is still starting: retry the connection
        self.right.sendall(struct.pack("!II", rank, self.world))
        try:
            self.left, _ = listener.accept()
        except TimeoutError as exc:
            raise CommError(f"rank {rank}: rank {self.left_rank} did not connect within {timeout:g} s") from exc
        finally:
            listener.close()
        their_rank, their_world = struct.unpack("!II", self._recv_exact(self.left, 8, time.monotonic() + timeout))
        if (their_rank, their_world) != (self.left_rank, self.world):
            raise CommError(f"rank {rank}: expected rank {self.left_rank}/{self.world}, got {their_rank}/{their_world}")
        for s in (self.left, self.right):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)

    def _recv_exact(self, sock: socket.socket, n: int, deadline: float) -> bytes:
        buf = b""
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise CommError(f"rank {self.rank}: rank {self.left_rank} closed the connection")
            buf += chunk
        return buf

    def _exchange(self, out: bytes, nbytes: int, what: str) -> bytes:
        """Send `out` to the right while receiving `nbytes` from the left (no deadlock on large chunks)."""
        deadline = time.monotonic() + self.timeout
        received, sent = bytearray(), 0
        with selectors.DefaultSelector() as sel:
            sel.register(self.left, selectors.EVENT_READ, "r")
            sel.register(self.right, selectors.EVENT_WRITE, "w")
            while len(received) < nbytes or sent < len(out):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommError(
                        f"rank {self.rank}: no data from rank {self.left_rank} ({self._addr(self.left_rank)}) for "
                        f"{self.timeout:g} s during {what}: the peer hangs or the link is down"
                    )
                for key, _ in sel.select(remaining):
                    try:
                        if key.data == "r":
                            chunk = self.left.recv(nbytes - len(received))
                            if not chunk:
                                raise CommError(
                                    f"rank {self.rank}: rank {self.left_rank} ({self._addr(self.left_rank)}) "
                                    f"closed the connection during {what}: the peer died"
                                )
                            received += chunk
                            if len(received) >= nbytes:
                                sel.unregister(self.left)
                        else:
                            sent += self.right.send(out[sent:])
                            if sent >= len(out):
                                sel.unregister(self.right)
                    except (ConnectionResetError, BrokenPipeError) as exc:
                        peer = self.left_rank if key.data == "r" else self.right_rank
                        raise CommError(
                            f"rank {self.rank}: connection to rank {peer} ({self._addr(peer)}) reset during {what}: "
                            "the peer died"
                        ) from exc
        return bytes(received)

    def _addr(self, rank: int) -> str:
        return f"{self.peers[rank][0]}:{self.peers[rank][1]}"

    def allreduce(self, vec: np.ndarray, step: int) -> np.ndarray:
        """Sum of `vec` over all ranks (reduce-scatter then all-gather); bit-identical on every rank."""
        w = self.world
        if w == 1:
            return vec.copy()
        chunks = [c.copy() for c in np.array_split(vec.astype(np.float64), w)]
        for phase in range(2 * (w - 1)):
            send_idx = (self.rank - phase) % w if phase < w - 1 else (self.rank + 1 - (phase - (w - 1))) % w
            recv_idx = (send_idx - 1) % w
            payload = chunks[send_idx].tobytes()
            msg = HEADER.pack(step, phase, send_idx, len(payload)) + payload
            expect = HEADER.size + chunks[recv_idx].nbytes
            data = self._exchange(msg, expect, f"step {step}")
            their_step, their_phase, idx, n = HEADER.unpack(data[: HEADER.size])
            if (their_step, their_phase, idx) != (step, phase, recv_idx):
                raise CommError(
                    f"rank {self.rank}: out of step with rank {self.left_rank}: got step {their_step} phase "
                    f"{their_phase} chunk {idx}, expected step {step} phase {phase} chunk {recv_idx}"
                )
            incoming = np.frombuffer(data[HEADER.size :], dtype=np.float64)
            if phase < w - 1:
                chunks[recv_idx] = chunks[recv_idx] + incoming
            else:
                chunks[recv_idx] = incoming.copy()
        return np.concatenate(chunks)

    def close(self) -> None:
        for name in ("left", "right"):
            s = getattr(self, name, None)
            if s is not None:
                s.close()


def shard(seed: int, rank: int, step: int, batch: int, true_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, rank, step])
    x = rng.standard_normal((batch, true_w.size))
    y = x @ true_w + 0.01 * rng.standard_normal(batch)
    return x, y


def latest_checkpoint(directory: Path) -> tuple[int, Path | None]:
    best, path = 0, None
    for p in directory.glob("ckpt-rank*-step*.npz"):
        m = re.fullmatch(r"ckpt-rank\d+-step(\d+)\.npz", p.name)
        if m and int(m.group(1)) > best:
            best, path = int(m.group(1)), p
    return best, path


def save_checkpoint(directory: Path, rank: int, step: int, w: np.ndarray, keep: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-rank{rank}-step{step}.npz"
    tmp = directory / f".ckpt-rank{rank}-step{step}.tmp.npz"
    np.savez(tmp, w=w, step=step)
    os.replace(tmp, final)  # atomic: a crash never leaves a half-written checkpoint
    mine = sorted(directory.glob(f"ckpt-rank{rank}-step*.npz"), key=lambda p: int(p.stem.rsplit("step", 1)[1]))
    for old in mine[:-keep]:
        old.unlink(missing_ok=True)


class Gloo:
    """The sum over torch.distributed's gloo backend, its process group set up by env:// (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE: torchrun's contract). A peer that dies fails the collective.
    """

    def __init__(self, rank: int, world: int, timeout: float) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.rank, self.torch, self.dist = rank, torch, dist
        try:
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
        except (RuntimeError, ValueError) as exc:  # DistNetworkError / DistStoreError are RuntimeErrors
            raise CommError(f"rank {rank}: gloo process group not set up: {exc}") from exc

    def allreduce(self, vec: np.ndarray, step: int) -> np.ndarray:
        tensor = self.torch.from_numpy(np.array(vec, dtype=np.float64))
        try:
            self.dist.all_reduce(tensor)
        except RuntimeError as exc:
            raise CommError(f"rank {self.rank}: gloo all_reduce of step {step} failed: the peer died ({exc})") from exc
        return tensor.numpy()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the group may be broken already: nothing left to tear down
            self.dist.destroy_process_group()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="testbed-train", description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=int(env.get("RANK", 0)))
    p.add_argument("--world-size", type=int, default=int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None)
    p.add_argument(
        "--backend",
        choices=("ring", "gloo"),
        default="ring",
        help="ring: its own TCP ring over --peers; gloo: torch.distributed, set up by env:// (needs PyTorch)",
    )
    p.add_argument("--peers", default=env.get("TESTBED_PEERS"), help="host:port,... in rank order")
    p.add_argument("--hostfile", help="one host:port per line, in rank order")
    p.add_argument("--bind", help="address to listen on (default: this rank's host in the peer list)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=env.get("TESTBED_CHECKPOINT_DIR"))
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--init-delay", type=float, default=0.0, help="seconds of communicator initialisation")
    p.add_argument("--step-time", type=float, default=0.0, help="minimum seconds per step (models compute)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds without data from a peer before failing")
    p.add_argument(
        "--fabric-phases",
        help="A,B,...: ask the job's fabric service (TESTBED_FABRIC_SERVICE) to set up A, then B, ... in turn, "
        "one every --fabric-every steps (a refusal is printed and training goes on)",
    )
    p.add_argument("--fabric-every", type=int, default=5, help="steps per fabric phase (--fabric-phases)")
    p.add_argument(
        "--rail",
        default=env.get("TESTBED_RAIL"),
        help="run a workload card's phases instead of the training loop, each phase's bytes over its own circuits "
        "(JSON, as testbed's rail.train step writes it into TESTBED_RAIL; hostside/phased.py)",
    )
    p.add_argument(
        "--collective",
        default=env.get("TESTBED_COLLECTIVE"),
        help="run all-reduces of the given sizes (ring, or recursive doubling asking the fabric service for each "
        "stage's configuration) instead of the training loop (JSON, as testbed's collective.allreduce step writes "
        "it into TESTBED_COLLECTIVE; hostside/collective.py)",
    )
    p.add_argument(
        "--log",
        default=env.get("TESTBED_RANK_LOG"),
        help="write this rank's output to this file ({rank}: the rank) instead of stdout and stderr",
    )
    args = p.parse_args(argv)
    args.local_rank = env.get("LOCAL_RANK")
    if args.backend == "gloo":
        if args.world_size is None or not 0 <= args.rank < args.world_size:
            p.error(f"--backend gloo needs RANK and WORLD_SIZE (rank {args.rank}, world size {args.world_size})")
        args.peer_list = None
        return args
    text = args.peers
    if args.hostfile:
        text = Path(args.hostfile).read_text()
    args.peer_list = parse_peers(text) if text else [("127.0.0.1", 0)]
    if args.world_size is None:
        args.world_size = len(args.peer_list)
    if not text and args.world_size is not None and args.world_size > 1:
        p.error(
            f"rank {args.rank} of {args.world_size}: where do the other ranks listen? Give --peers, --hostfile or "
            "TESTBED_PEERS (MASTER_ADDR and MASTER_PORT alone set up --backend gloo, not the ring)"
        )
    if len(args.peer_list) != args.world_size or not 0 <= args.rank < args.world_size:
        p.error(f"rank {args.rank}, world size {args.world_size} and {len(args.peer_list)} peers do not fit")
    return args


def _fabric_phase(fabric, rank: int, config: str):
    """Ask the fabric service for `config` at a phase boundary; says what it answered. Returns the client."""
    from hostside.fabric_client import FabricClient, FabricError  # only a phased job pays for it

    if fabric is None:
        fabric = FabricClient(rank=rank)
    try:
        fabric.setup(config)
        print(f"fabric {config} ok", flush=True)
    except FabricError as exc:
        print(f"fabric {config} refused: {exc}", flush=True)
    return fabric


def _phased(args: argparse.Namespace, say) -> int:
    """--rail: the workload card's phases (hostside/phased.py) instead of the training loop."""
    from hostside import phased

    try:
        spec = phased.parse_spec(args.rail)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    fabric = None
    if spec.mode != "static":
        from hostside.fabric_client import FabricClient

        fabric = FabricClient(rank=args.rank)
    host, port = args.peer_list[args.rank]
    say(f"ready rank {args.rank} world {args.world_size} step 0")
    try:
        phased.run(spec, args.rank, (args.bind or host, port), args.timeout, fabric, say)
    except (phased.PhaseError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_COMM
    finally:
        if fabric is not None:
            fabric.close()
    say(f"done rank {args.rank} steps {spec.iterations}")
    return 0


def _collective(args: argparse.Namespace, say) -> int:
    """--collective: all-reduces of each size (hostside/collective.py) instead of the training loop."""
    from hostside import collective

    try:
        spec = collective.parse_spec(args.collective)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    fabric = None
    if spec.algorithm == "rd":  # a ring never changes the fabric; recursive doubling asks before every stage
        from hostside.fabric_client import FabricClient

        fabric = FabricClient(rank=args.rank)
    host, port = args.peer_list[args.rank]
    say(f"ready rank {args.rank} world {args.world_size} step 0")
    try:
        collective.run(spec, args.rank, args.world_size, (args.bind or host, port), args.timeout, fabric, say)
    except (collective.CollectiveError, collective.PhaseError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_COMM
    finally:
        if fabric is not None:
            fabric.close()
    return 0


def _to_log(template: str, rank: int) -> None:
    """From now on this process's stdout and stderr go to its own log file (appended to)."""
    path = Path(template.replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = args.rank, args.world_size
    if args.log:
        _to_log(args.log, rank)

    def say(line: str) -> None:
        print(line, flush=True)

    local = "" if args.local_rank is None else f" local_rank={args.local_rank}"
    say(
        f"rank {rank}/{world} starting pid {os.getpid()} "
        f"cuda_visible_devices={os.environ.get('CUDA_VISIBLE_DEVICES')}{local}"
    )
    if args.init_delay > 0:
        time.sleep(args.init_delay)  # models NCCL communicator set-up
    if args.rail:
        return _phased(args, say)
    if args.collective:
        return _collective(args, say)
    true_w = np.random.default_rng(args.seed).standard_normal(args.dim)
    w = np.zeros(args.dim)
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    ring: Gloo | Ring
    try:
        if args.backend == "gloo":
            ring = Gloo(rank, world, args.timeout)
        else:
            ring = Ring(rank, args.peer_list, args.timeout, args.bind)
    except (CommError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_COMM
    try:
        # Agree on where to resume: the newest checkpoint any rank holds; its holder sends the parameters.
        mine, path = latest_checkpoint(ckpt_dir) if ckpt_dir else (0, None)
        steps = np.zeros(world)
        steps[rank] = mine
        steps = ring.allreduce(steps, 0)
        start = int(steps.max())
        source = int(np.argmax(steps))
        if start > 0:
            if rank == source:
                assert path is not None  # the rank that holds the newest checkpoint
                w = np.load(path)["w"]
            w = ring.allreduce(w if rank == source else np.zeros(args.dim), 0)
            say(f"resumed from step {start} (checkpoint of rank {source})")
        say(f"ready rank {rank} world {world} step {start}")
        phases = [p for p in (args.fabric_phases or "").split(",") if p]
        fabric = None
        for step in range(start + 1, args.steps + 1):
            t0 = time.monotonic()
            if phases and (step - 1) % max(1, args.fabric_every) == 0:
                fabric = _fabric_phase(fabric, rank, phases[((step - 1) // max(1, args.fabric_every)) % len(phases)])
            x, y = shard(args.seed, rank, step, args.batch, true_w)
            err = x @ w - y
            grad = x.T @ err / args.batch
            loss = float(np.mean(err**2))
            total = ring.allreduce(np.append(grad, loss), step) / world
            w = w - args.lr * total[:-1]
            say(f"step {step} loss {total[-1]:.6f}")
            if ckpt_dir and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
                save_checkpoint(ckpt_dir, rank, step, w)
            spare = args.step_time - (time.monotonic() - t0)
            if spare > 0:
                time.sleep(spare)
    except CommError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_COMM
    finally:
        ring.close()
    say(f"done rank {rank} steps {args.steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
