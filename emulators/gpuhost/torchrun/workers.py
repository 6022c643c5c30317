"""A node's workers, from start to end: each one's environment and command line as torchrun's agent makes them,
the programs an emulated host lets them be, where their error files go, their start, the monitor that watches
them, their stop, and torchrun's report of the ones that failed.

A worker's environment is the launcher's own plus torchrun's variables (`worker_env`), its arguments with
${local_rank} substituted; --no-python runs the program itself, otherwise `python -u [-m] SCRIPT`. When one
fails the others are stopped (SIGTERM, SIGKILL after 30 s). Unlike torchrun's, the workers stay in the
launcher's process group (see the package's docstring).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from emulators.gpuhost.torchrun.options import Config
from emulators.gpuhost.torchrun.rendezvous import Assignment

ALLOWLIST_ENV = "TESTBED_EMULATED_PROGRAMS"  # set by the emulated host: the programs it may start
CLOSE_TIMEOUT_S = 30.0  # torchrun's grace before SIGKILL when it stops its workers


def worker_env(cfg: Config, a: Assignment, local_rank: int) -> dict[str, str]:
    """torchrun's variables for one worker (LocalElasticAgent._start_workers)."""
    rank = a.base_rank + local_rank
    return {
        "RANK": str(rank),
        "GROUP_RANK": str(a.group_rank),
        "ROLE_RANK": str(rank),  # one role: a worker's rank among its role's is its global rank
        "ROLE_NAME": cfg.role,
        "LOCAL_WORLD_SIZE": str(cfg.nproc_per_node),
        "WORLD_SIZE": str(a.world_size),
        "GROUP_WORLD_SIZE": str(a.group_world_size),
        "ROLE_WORLD_SIZE": str(a.world_size),
        "MASTER_ADDR": a.master_addr,
        "MASTER_PORT": str(a.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
        "TORCHELASTIC_RUN_ID": cfg.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(cfg.rdzv_backend == "static"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "LOCAL_RANK": str(local_rank),
    }


def worker_argv(cfg: Config, local_rank: int) -> list[str]:
    """One worker's command line."""
    args = [a.replace("${local_rank}", str(local_rank)) for a in cfg.args]  # torchrun's macros.substitute
    if cfg.no_python:
        return [cfg.program, *args]
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    return [python, "-u", *(["-m"] if cfg.module else []), cfg.program, *args]


def program_refusal(cfg: Config) -> str | None:
    """On an emulated host, only its allowlisted programs may start; why this one may not, or None."""
    allowed = os.environ.get(ALLOWLIST_ENV)
    if allowed is None:
        return None
    names = [n for n in allowed.split(",") if n]
    if not cfg.no_python:
        return (
            "the emulated host starts only its own programs: launch one by name with --no-python "
            f"(allowed: {', '.join(names) or 'none'})"
        )
    if "/" in cfg.program or cfg.program not in names:
        return f"FileNotFoundError: [Errno 2] No such file or directory: '{cfg.program}'"
    return None


def log_dirs(cfg: Config) -> tuple[str, str | None]:
    """DefaultLogsSpecs' layout, <log_dir>/<run_id>_<random>/attempt_0, where each worker's error file goes
    (TORCHELASTIC_ERROR_FILE); and the folder made for it when no --log-dir was given, removed at exit. That
    folder is a temporary one, as torchrun's; on an emulated host, in the host's own home (its /tmp).
    """
    made = None
    base = cfg.log_dir
    if not base:
        tmp = None
        if ALLOWLIST_ENV in os.environ and os.environ.get("HOME"):
            tmp = os.path.join(os.environ["HOME"], ".tmp")
            os.makedirs(tmp, exist_ok=True)
        base = made = tempfile.mkdtemp(prefix="torchelastic_", dir=tmp)
    os.makedirs(base, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix=f"{cfg.run_id}_", dir=base)
    attempt = os.path.join(run_dir, "attempt_0")
    os.makedirs(attempt)
    return attempt, made


@dataclass
class Worker:
    """One started worker: its ranks, its process, the file torchrun tells it to write its error to."""

    local_rank: int
    rank: int
    proc: subprocess.Popen
    error_file: str


def start_workers(cfg: Config, a: Assignment, attempt_dir: str, workers: list[Worker]) -> None:
    """Start the node's workers into `workers` (a signal in between leaves the ones started there)."""
    base = {k: v for k, v in os.environ.items() if k != ALLOWLIST_ENV}
    for local in range(cfg.nproc_per_node):
        clog = os.path.join(attempt_dir, str(local))
        os.makedirs(clog, exist_ok=True)
        error_file = os.path.join(clog, "error.json")
        env = {**base, **worker_env(cfg, a, local), "TORCHELASTIC_ERROR_FILE": error_file}
        proc = subprocess.Popen(worker_argv(cfg, local), env=env, close_fds=True)  # in this process group
        workers.append(Worker(local, a.base_rank + local, proc, error_file))


def stop_workers(workers: list[Worker], sig: int = signal.SIGTERM, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Send `sig` to the workers still running, and SIGKILL to those that outlive `timeout`."""
    for w in workers:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(sig)
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            w.proc.wait()


def monitor(cfg: Config, workers: list[Worker]) -> list[tuple[Worker, int, float]]:
    """Poll the workers every monitor interval until one has failed or all are done; the failures."""
    running = list(workers)
    failures: list[tuple[Worker, int, float]] = []
    while running and not failures:
        time.sleep(cfg.monitor_interval)  # torchrun's monitor loop (the agent's _monitor_workers)
        for w in list(running):
            code = w.proc.poll()
            if code is not None:
                running.remove(w)
                if code != 0:
                    failures.append((w, code, time.time()))
    return failures


def failure_summary(cfg: Config, failures: list[tuple[Worker, int, float]]) -> str:
    """torchrun's ChildFailedError report, its root cause first."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    bar = "=" * 60
    first, *others = sorted(failures, key=lambda f: f[2])

    def entry(f) -> str:
        w, code, when = f
        exit_text = f"{code} (pid: {w.proc.pid})"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            exit_text += f"\n  error_file: <N/A>\n  traceback : Signal {-code} ({name}) received by PID {w.proc.pid}"
        else:
            exit_text += "\n  error_file: <N/A>\n  traceback : To enable traceback see: "
            exit_text += "https://pytorch.org/docs/stable/elastic/errors.html"
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(when))
        return (
            f"[{w.local_rank}]:\n  time      : {stamp}\n  host      : {host}\n"
            f"  rank      : {w.rank} (local_rank: {w.local_rank})\n  exitcode  : {exit_text}"
        )

    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        f"{bar}\n{cfg.program} FAILED\n{'-' * 60}\nFailures:\n"
        + ("\n".join(entry(f) for f in others) if others else "  <NO_OTHER_FAILURES>")
        + f"\n{'-' * 60}\nRoot Cause (first observed failure):\n{entry(first)}\n{bar}\n"
    )
