"""Can TorchFT's released package run the project's failover experiment? A probe on CPU (gloo), one machine.

    python bench/torchft_probe.py [--ddp torchft|manual] [--fault kill|stop] [--kill-delay-ms 10] [--json OUT]

Needs torch and torchft (pip install torchft==0.2.0; not a dependency of testbed, docs/interop.md "TorchFT").
What it runs, all on 127.0.0.1 and all started here as subprocesses:
- the lighthouse, torchft's own (its torchft_lighthouse entry point), with --min_replicas groups - 1 so that the
  survivors of one failure still make a quorum;
- --groups replica groups, one process each: its own TCPStore, torchft.Manager over torchft.ProcessGroupGloo,
  torchft.Optimizer around SGD, a small MLP, and the gradients averaged either by torchft.DistributedDataParallel
  (--ddp torchft, the loop torchft's README shows) or by manager.allreduce after the backward pass (--ddp manual);
- once group 1 has committed --kill-at steps and --kill-delay-ms more have passed (so that the fault lands
  inside its next step, where the steps are back to back with --step-s 0), it is sent SIGKILL (--fault kill) or
  SIGSTOP (--fault stop); --spare-after seconds later a spare group is started. When the spare has committed
  --spare-steps steps, every group is told the step to stop after.
Every group prints one JSON line per step (its step counter, whether the step committed, the quorum's size and a
digest of the weights), so the report says where each survivor was when the peer failed, how long until its next
committed step, whether it crashed (the error and the traceback's tail), and when the spare joined and whether it
holds the survivors' weights after the same step. Bounded by --deadline; every process started here is ended.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

VICTIM = 1  # the group the fault hits (never group 0, whose log the report's timing starts from)


# --- the replica group (run as a subprocess of this script with --worker) ---


def _told_to_stop(stop_file: str, step: int) -> bool:
    """Whether the driver has named the step every group stops after, and this group has committed it."""
    try:
        return step >= int(Path(stop_file).read_text())
    except (FileNotFoundError, ValueError):
        return False  # not written yet (or half-written: read again next step)


def run_group(args: argparse.Namespace) -> int:
    """One replica group of world size 1: torchft's fault-tolerant DDP loop, one JSON line per step."""
    from datetime import timedelta

    import torch
    import torchft  # type: ignore[import-untyped]  # torchft ships no type information
    from torch import nn

    def emit(**record: object) -> None:
        print(json.dumps({"group": args.group, "t": time.time(), **record}), flush=True)

    # A store of its own: torchft's Manager expects one per replica group (torchrun's, in its README).
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        sgd.load_state_dict(state["optim"])  # type: ignore[arg-type]

    timeout = timedelta(seconds=args.timeout_s)
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.min_replicas,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.quorum_timeout_s),
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"group{args.group}",
        hostname="127.0.0.1",
    )
    # --ddp torchft: torchft's DistributedDataParallel, whose comm hook allreduces each gradient bucket;
    # --ddp manual: the bare model, each gradient allreduced through manager.allreduce after the backward pass.
    net = torchft.DistributedDataParallel(manager, model) if args.ddp == "torchft" else model
    optimizer = torchft.Optimizer(manager, sgd)
    emit(event="ready", pid=os.getpid())
    data = torch.Generator().manual_seed(1000 + args.group)
    deadline = time.monotonic() + args.run_s
    try:
        while time.monotonic() < deadline and not _told_to_stop(args.stop_file, manager.current_step()):
            inputs = torch.randn(16, 32, generator=data)
            labels = torch.randint(0, 4, (16,), generator=data)
            step_before = manager.current_step()
            optimizer.zero_grad()  # starts the quorum for this step
            loss = nn.functional.cross_entropy(net(inputs), labels)
            loss.backward()  # under --ddp torchft the gradient allreduce runs in DDP's comm hook
            if args.ddp == "manual":
                for work in [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]:
                    work.wait()  # torchft's Work reports a failed allreduce to the manager instead of raising
            optimizer.step()  # steps SGD only if every group's should_commit said yes
            committed = manager.current_step() > step_before
            digest = float(sum(p.detach().double().sum() for p in model.parameters()))
            emit(
                event="step",
                step=manager.current_step(),
                committed=committed,
                participants=manager.num_participants(),
                digest=digest,
            )
            time.sleep(args.step_s)  # stands in for the compute of a real step, so the fault lands mid-run
    except BaseException as exc:
        emit(event="crash", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        raise
    emit(event="done", step=manager.current_step())
    manager.shutdown(wait=False)
    return 0


# --- the driver ---


@dataclass
class Group:
    index: int
    proc: subprocess.Popen[str]
    stderr_path: Path
    started: float
    records: list[dict] = field(default_factory=list)

    def steps(self) -> list[dict]:
        return [r for r in self.records if r.get("event") == "step"]

    def crash(self) -> dict | None:
        return next((r for r in self.records if r.get("event") == "crash"), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lighthouse_command(port: int, min_replicas: int, heartbeat_timeout_ms: int) -> list[str]:
    """torchft's lighthouse: its console script, or the same server through torchft.coordination."""
    binary = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchft_lighthouse"
    )
    options = dict(
        bind=f"127.0.0.1:{port}",
        min_replicas=min_replicas,
        join_timeout_ms=1000,
        quorum_tick_ms=100,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    if binary:
        return [binary, *(f"--{k}={v}" for k, v in options.items())]
    code = (
        "import time; from torchft.coordination import LighthouseServer; "
        f"s = LighthouseServer(**{options!r}); print(s.address(), flush=True); time.sleep(1e9)"
    )
    return [sys.executable, "-c", code]


def start_group(index: int, args: argparse.Namespace, lighthouse: str, logdir: Path, events: queue.Queue) -> Group:
    stderr_path = logdir / f"group{index}.stderr"
    command = [
        sys.executable,
        __file__,
        "--worker",
        f"--group={index}",
        f"--lighthouse={lighthouse}",
        f"--min-replicas={args.groups - 1}",
        f"--stop-file={logdir / 'stop-step'}",
        f"--ddp={args.ddp}",
        f"--step-s={args.step_s}",
        f"--timeout-s={args.timeout_s}",
        f"--quorum-timeout-s={args.quorum_timeout_s}",
        f"--run-s={args.deadline}",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr_path.open("w"), text=True, env=env, start_new_session=True
    )
    group = Group(index, proc, stderr_path, time.time())

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray print of the library's; the JSON lines are ours
            events.put((index, record))

    threading.Thread(target=read, daemon=True).start()
    return group


def end(proc: subprocess.Popen) -> None:
    """SIGKILL (it also ends a SIGSTOPped process) and reap, by this process's own id."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def probe(args: argparse.Namespace) -> dict:
    import torch

    versions = {"torch": torch.__version__, "torchft": _version("torchft"), "python": sys.version.split()[0]}
    logdir = Path(tempfile.mkdtemp(prefix="torchft-probe-"))
    port = free_port()
    lighthouse = subprocess.Popen(
        lighthouse_command(port, args.groups - 1, args.heartbeat_timeout_ms),
        stdout=(logdir / "lighthouse.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{port}"
    events: queue.Queue = queue.Queue()
    groups: dict[int, Group] = {}
    fault_at: float | None = None
    spare_started: float | None = None
    spare_index = args.groups
    stop_file = logdir / "stop-step"
    t0 = time.time()
    try:
        _wait_port(port, lighthouse)
        for index in range(args.groups):
            groups[index] = start_group(index, args, address, logdir, events)
        while time.time() - t0 < args.deadline:
            try:
                index, record = events.get(timeout=0.2)
                groups[index].records.append(record)
            except queue.Empty:
                record = None
            victim = groups[VICTIM]
            # counted in its own commits: a group that started late heals to the others' step count at once
            if fault_at is None and sum(s["committed"] for s in victim.steps()) >= args.kill_at:
                time.sleep(args.kill_delay_ms / 1000)  # how far into the next step the fault lands
                os.kill(victim.proc.pid, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
                fault_at = time.time()
            if fault_at is not None and spare_started is None and time.time() - fault_at >= args.spare_after:
                groups[spare_index] = start_group(spare_index, args, address, logdir, events)
                spare_started = groups[spare_index].started
            spare = groups.get(spare_index)
            if spare is not None and not stop_file.exists() and _spare_done(spare, args):
                # every group trains on to the same step, so none of them sees a peer leave before it stops
                last = max((s["step"] for g in groups.values() for s in g.steps()), default=0)
                stop_file.write_text(str(last + 3))
            others = [g for i, g in groups.items() if i != VICTIM]
            if spare is not None and all(g.proc.poll() is not None for g in others) and events.empty():
                break
            if fault_at is None and any(g.proc.poll() is not None for g in groups.values()):
                break  # something ended before the fault: report it as it is
    finally:
        for group in groups.values():
            end(group.proc)
        end(lighthouse)
    while not events.empty():
        index, record = events.get()
        groups[index].records.append(record)
    return summarise(args, versions, groups, fault_at, spare_started, t0, logdir)


def _spare_done(spare: Group, args: argparse.Namespace) -> bool:
    """The spare has committed --spare-steps steps, has ended, or has had --join-limit seconds to join."""
    committed = [s for s in spare.steps() if s["committed"]]
    return (
        len(committed) >= args.spare_steps
        or spare.proc.poll() is not None
        or time.time() - spare.started > args.join_limit
    )


def _wait_port(port: int, proc: subprocess.Popen) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"the lighthouse exited with {proc.returncode} before it listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the lighthouse did not listen within 10 s")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def summarise(
    args: argparse.Namespace,
    versions: dict,
    groups: dict[int, Group],
    fault_at: float | None,
    spare_started: float | None,
    t0: float,
    logdir: Path,
) -> dict:
    report: dict = {"versions": versions, "ddp": args.ddp, "fault": args.fault, "groups": args.groups}
    report["logs"] = str(logdir)
    report["fault_at_s"] = None if fault_at is None else round(fault_at - t0, 3)
    per_group = {}
    for index, group in sorted(groups.items()):
        steps = group.steps()
        committed = [s for s in steps if s["committed"]]
        role = "victim" if index == VICTIM else ("spare" if index >= args.groups else "survivor")
        entry: dict = {
            "role": role,
            "exit": group.proc.returncode,
            "last_step": steps[-1]["step"] if steps else None,
            "committed_steps": len(committed),
            "failed_steps": len(steps) - len(committed),
        }
        crash = group.crash()
        if crash:
            entry["crash"] = crash["error"]
            entry["traceback_tail"] = crash["traceback"].strip().splitlines()[-6:]
        if group.proc.returncode not in (0, None, -signal.SIGKILL) and not crash:
            entry["stderr_tail"] = _tail(group.stderr_path)
        if role == "survivor" and fault_at is not None:
            before = [s for s in committed if s["t"] < fault_at]
            after = [s for s in committed if s["t"] >= fault_at]
            entry["step_at_fault"] = before[-1]["step"] if before else None
            if after:
                entry["first_commit_after_fault"] = {
                    "step": after[0]["step"],
                    "after_s": round(after[0]["t"] - fault_at, 3),
                    "participants": after[0]["participants"],
                }
            entry["failed_steps_after_fault"] = len([s for s in steps if s["t"] >= fault_at and not s["committed"]])
        if role == "spare" and spare_started is not None:
            ready = next((r for r in group.records if r.get("event") == "ready"), None)
            if ready:
                entry["ready_after_start_s"] = round(ready["t"] - spare_started, 3)  # Python, torch, Manager up
            if steps:
                first = steps[0]
                entry["first_step"] = {"step": first["step"], "after_start_s": round(first["t"] - spare_started, 3)}
            if committed:
                entry["first_commit_after_start_s"] = round(committed[0]["t"] - spare_started, 3)
                entry["weights_match_survivors"] = _weights_match(group, groups, args)
        per_group[f"group{index}"] = entry
    report["per_group"] = per_group
    survivors = [e for e in per_group.values() if e["role"] == "survivor"]
    spares = [e for e in per_group.values() if e["role"] == "spare"]
    report["survivors_continued"] = all("first_commit_after_fault" in e and "crash" not in e for e in survivors)
    report["spare_joined"] = bool(spares) and all(e.get("weights_match_survivors") is True for e in spares)
    return report


def _weights_match(spare: Group, groups: dict[int, Group], args: argparse.Namespace) -> bool | None:
    """Whether the spare's weights equal a survivor's after the same committed step: it received the state."""
    survivor = groups[0].steps()
    for record in spare.steps():
        if not record["committed"]:
            continue
        same = [s for s in survivor if s["committed"] and s["step"] == record["step"]]
        if same:
            return abs(same[0]["digest"] - record["digest"]) <= 1e-6 * max(1.0, abs(record["digest"]))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=3, help="replica groups at the start (>= 2)")
    parser.add_argument(
        "--ddp", choices=("torchft", "manual"), default="torchft", help="torchft's DDP wrapper or manager.allreduce"
    )
    parser.add_argument("--fault", choices=("kill", "stop"), default="kill", help="SIGKILL or SIGSTOP group 1")
    parser.add_argument("--kill-at", type=int, default=40, help="group 1's commits before the fault")
    parser.add_argument("--spare-steps", type=int, default=5, help="committed steps of the spare's before the end")
    parser.add_argument("--join-limit", type=float, default=60.0, help="seconds the spare has to join")
    parser.add_argument("--step-s", type=float, default=0.0, help="pause per step (stands in for compute)")
    parser.add_argument("--kill-delay-ms", type=float, default=10.0, help="from group 1's step line to the fault")
    parser.add_argument("--spare-after", type=float, default=1.0, help="seconds from the fault to the spare's start")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="torchft's collective and RPC timeout")
    parser.add_argument("--quorum-timeout-s", type=float, default=30.0, help="torchft's quorum timeout")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=2000, help="the lighthouse's dead-replica limit")
    parser.add_argument("--deadline", type=float, default=150.0, help="seconds before everything is ended")
    parser.add_argument("--json", type=Path, help="also write the report here")
    # the replica group's own options (the driver passes them)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--min-replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--run-s", type=float, default=150.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_group(args)
    if args.groups < 2:
        parser.error("--groups must be at least 2: one group fails and the others carry on")
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        parser.error(f"torchft does not import here ({exc}); pip install torchft==0.2.0")
    report = probe(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
