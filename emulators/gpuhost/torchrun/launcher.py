"""One launcher's run, as torchrun's: the rendezvous, the node's workers started and watched, and its exit status.

It exits 0 when every worker succeeds, and 1 with torchrun's failure summary once one fails (the others are
stopped first). SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on to the workers, and it exits 1 once they are
gone (the SignalException torchrun dies of). With TESTBED_TWIN_TORCHRUN=real in its environment it hands the
(checked) command line to PyTorch's own launcher instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys

from emulators.gpuhost.torchrun.options import Config, parse_args
from emulators.gpuhost.torchrun.rendezvous import RendezvousError, rendezvous
from emulators.gpuhost.torchrun.workers import (
    ALLOWLIST_ENV,
    Worker,
    failure_summary,
    log_dirs,
    monitor,
    program_refusal,
    start_workers,
    stop_workers,
)

REAL_ENV = "TESTBED_TWIN_TORCHRUN"  # "real": run PyTorch's torchrun instead of this stand-in
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # --signals-to-handle's default
OMP_WARNING = (
    "\n*****************************************\nSetting OMP_NUM_THREADS environment variable for each "
    "process to be 1 in default, to avoid your system being overloaded, please further tune the variable "
    "for optimal performance in your application as needed. \n*****************************************"
)


class SignalException(Exception):
    """A handled signal reached the launcher: it stops its workers and exits 1."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"Process {os.getpid()} got signal: {signum}")
        self.signum = signum


def _raise_signal(signum, frame) -> None:
    raise SignalException(signum)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(cfg: Config) -> int:
    """Run one launcher to its end; its exit status."""
    why = program_refusal(cfg)
    if why is not None:
        _say(why)
        return 1
    if "OMP_NUM_THREADS" not in os.environ and cfg.nproc_per_node > 1:
        _say(OMP_WARNING)
        os.environ["OMP_NUM_THREADS"] = "1"
    keep: list[socket.socket] = []
    workers: list[Worker] = []
    made = None
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, _raise_signal)
    try:
        try:
            assignment = rendezvous(cfg, keep)
        except RendezvousError as exc:
            _say(str(exc))
            return 1
        try:
            attempt, made = log_dirs(cfg)
            start_workers(cfg, assignment, attempt, workers)
        except OSError as exc:  # a log folder that cannot be made, a program that cannot be executed
            stop_workers(workers)
            _say(f"{type(exc).__name__}: {exc}")
            return 1
        failures = monitor(cfg, workers)
        if failures:
            stop_workers(workers)
            _say(failure_summary(cfg, failures))
            return 1
        return 0
    except SignalException as exc:
        for sig in HANDLED_SIGNALS:  # a second signal must not interrupt the shutdown
            signal.signal(sig, signal.SIG_IGN)
        _say(f"Received {exc.signum} death signal, shutting down workers")
        stop_workers(workers, exc.signum)
        _say(f"torch.distributed.elastic.multiprocessing.api.SignalException: {exc}")
        return 1
    finally:
        for s in keep:
            s.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`torchrun ARGS`: the stand-in's exit status, or PyTorch's launcher in its place (REAL_ENV)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    if os.environ.get(REAL_ENV) == "real":
        why = program_refusal(cfg)
        if why is not None:
            _say(why)
            return 1
        os.environ.pop(REAL_ENV)
        os.environ.pop(ALLOWLIST_ENV, None)
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv])
    return run(cfg)
