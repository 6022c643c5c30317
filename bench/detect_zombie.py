"""Detection of a SIGKILLed rank: the kill -> the watch's exit, the old watch against the new, side by side.

    python bench/detect_zombie.py [--samples 20] [--heartbeat 0.05] [--give-up 3] [--local]

- old: `tail -n 0 -s HB --pid=RANK -F LOG`, which ends once the rank's pid is gone, i.e. once whoever adopted
  the rank has reaped it;
- new: drivers/gpuhost/watch.py's command, a loop reading the rank's state in /proc/RANK/stat every heartbeat
  (a zombie counts as exited) that tail --pid follows instead of the rank.

Each on a real OpenSSH server on 127.0.0.1 run by this user (as tests/gpuhost/test_real_sshd.py runs it) when
/usr/sbin/sshd is installed, else (or with --local) on a local bash; under two adopters of the orphaned rank (it
is started with setsid, and its starting shell exits): this machine's own (PID 1, or the subreaper the benchmark
runs under) and a subreaper that never reaps (a container whose PID 1 is no init). A sample: a rank printing a
step line every 20 ms is started, the watch opened, and on the first line the rank is SIGKILLed here (it is a
process of this machine); the time is from just before the kill to the watch's end as seen here (its channel's
exit, or bash's). Old and new alternate sample by sample. A watch that has not ended `--give-up` seconds after
the kill is counted as never ending (the old one under the subreaper that never reaps).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlib import REPO, stats, write_out
from rich.console import Console

from drivers.capabilities import JobHandle
from drivers.gpuhost.watch import watch_command
from testbed.families.drivers import make_driver

sys.path.insert(0, str(REPO / "tests" / "gpuhost"))
from sshd_server import SSHD, running_sshd  # noqa: E402

BASH = shutil.which("bash") or "/bin/bash"
STEPPER = 'i=0; while :; do i=$((i+1)); echo "step $i"; sleep 0.02; done'
TARGET_P50_MS = 100.0
HOW = """**Detection of a SIGKILLed rank** (`bench/detect_zombie.py`). A rank printing a step line every 20 ms,
started with setsid over a real sshd on 127.0.0.1 (a local bash without sshd), is SIGKILLed on the first line
its watch reads; from just before the kill to the watch's end (its channel's exit): the watch of
drivers/gpuhost/watch.py (a loop reading the rank's state in /proc, followed by tail --pid) and the old one (GNU
tail --pid on the rank), alternating sample by sample, with the orphaned rank adopted by this machine's PID 1 and
by a subreaper that never reaps (a container whose PID 1 is no init). A watch not ended a few seconds after the
kill counts as never ending."""

# A subreaper that never reaps: every orphan below it that dies stays a zombie until it ends.
HOARDER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = os.fork()
if child == 0:
    os.execv(sys.argv[1], sys.argv[1:])
def end(*_):
    os.kill(child, signal.SIGKILL)
    os._exit(0)
signal.signal(signal.SIGTERM, end)
while True:
    signal.pause()
"""

ADOPTERS = {"this machine's": None, "a subreaper that never reaps": HOARDER}


def old_command(job: JobHandle, heartbeat_s: float) -> str:
    return f"tail -n 0 -s {heartbeat_s:g} --pid={int(job.pid)} -F {shlex.quote(job.log)}"


def new_command(job: JobHandle, heartbeat_s: float) -> str:
    return watch_command(job, heartbeat_s, 0)


WATCHES: dict[str, Callable[[JobHandle, float], str]] = {"old (tail --pid on the rank)": old_command}
WATCHES["new (/proc state loop)"] = new_command


# --- the real-sshd host -------------------------------------------------------------------------------


@contextmanager
def real_sshd(folder: Path, wrapper: str | None = None) -> Iterator[Any]:
    """sshd on 127.0.0.1 (under `wrapper`, a Python program given sshd's command line, if any) run by this user;
    yields the GPU-host driver connected to it (bench/gpu_host.py probes this machine through it).
    """
    with running_sshd(folder, wrapper) as settings:
        drv = make_driver("ssh", "bench", settings)
        try:
            yield drv
        finally:
            drv.close()


@contextmanager
def sshd_host(folder: Path, wrapper: str | None) -> Iterator[Callable]:
    """sshd on 127.0.0.1 (under `wrapper`, if any); yields the sampler of that host."""
    with real_sshd(folder, wrapper) as drv:

        def sample(watch: Callable[[JobHandle, float], str], heartbeat_s: float, give_up_s: float) -> float | None:
            job = drv.run_job(["sh", "-c", STEPPER], name="rank", workdir=str(folder / "jobs"))
            killed_ns = None
            stream = drv.transport.stream(watch(job, heartbeat_s), idle_s=heartbeat_s)
            try:
                for chunk in stream:
                    if killed_ns is None and chunk.kind == "out":
                        killed_ns = time.monotonic_ns()
                        os.kill(job.pid, signal.SIGKILL)
                    elif chunk.kind == "exit":
                        return (chunk.mono_ns - killed_ns) / 1e6 if killed_ns is not None else None
                    if killed_ns is not None and time.monotonic_ns() - killed_ns > give_up_s * 1e9:
                        return None
            finally:
                stream.close()
                with_kill(job.pid)
            return None

        yield sample


# --- a local bash --------------------------------------------------------------------------------------


@contextmanager
def local_host(folder: Path, wrapper: str | None) -> Iterator[Callable]:
    """A local bash: the rank is started by a bash that exits (under `wrapper`, which adopts it, if any)."""
    adopters: list[subprocess.Popen] = []

    def sample(watch: Callable[[JobHandle, float], str], heartbeat_s: float, give_up_s: float) -> float | None:
        log = folder / "rank.log"
        start = f"setsid sh -c {shlex.quote(STEPPER)} > {shlex.quote(str(log))} 2>&1 < /dev/null & echo $!"
        command = [BASH, "-c", start]
        if wrapper is not None:
            command = [sys.executable, "-c", wrapper, *command]
        starter = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        adopters.append(starter)
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        if wrapper is None:
            starter.wait()
        job = JobHandle("local", "rank", pid, str(log), str(folder))
        proc = subprocess.Popen([BASH, "-c", watch(job, heartbeat_s)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            proc.stdout.readline()  # the first step line after the watch began
            killed_ns = time.monotonic_ns()
            os.kill(pid, signal.SIGKILL)
            try:
                proc.wait(give_up_s)  # its end is what is timed: the wait returns as it exits
            except subprocess.TimeoutExpired:
                return None
            return (time.monotonic_ns() - killed_ns) / 1e6
        finally:
            proc.kill()
            proc.wait()
            with_kill(pid)

    try:
        yield sample
    finally:
        for a in adopters:
            a.terminate()
            a.wait()


def with_kill(pid: int) -> None:
    """The rank ended whatever happened to the sample (it may be long gone)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- measure ---------------------------------------------------------------------------------------------


def measure(
    samples: int = 20,
    heartbeat_s: float = 0.05,
    give_up_s: float = 3.0,
    local: bool = False,
    console: Console | None = None,
) -> dict:
    console = console or Console()
    sshd = os.path.exists(SSHD) and not local
    path = "real sshd on 127.0.0.1" if sshd else "local bash" + ("" if local else " (sshd is not installed)")
    host = sshd_host if sshd else local_host
    figures: dict = {"path": path, "samples": samples, "heartbeat_s": heartbeat_s, "give_up_s": give_up_s}
    rows = []
    for adopter, wrapper in ADOPTERS.items():
        with tempfile.TemporaryDirectory(prefix="detect-zombie-") as tmp:
            folder = Path(tmp)
            os.chmod(folder, 0o700)
            with host(folder, wrapper) as sample:
                seen: dict[str, list[float | None]] = {name: [] for name in WATCHES}
                for _ in range(samples):
                    for name, watch in WATCHES.items():  # alternating, sample by sample
                        seen[name].append(sample(watch, heartbeat_s, give_up_s))
        for name, got in seen.items():
            ended = [x for x in got if x is not None]
            row: dict[str, Any] = {
                "adopter": adopter,
                "watch": name,
                "ms": stats(ended),
                "never_ended": len(got) - len(ended),
                "n": len(got),
            }
            rows.append(row)
            p50 = f"p50 {row['ms']['p50']:.0f} ms" if ended else "never"
            console.print(f"{adopter:32} {name:30} {p50} ({row['never_ended']}/{len(got)} not ended in {give_up_s} s)")
    figures["rows"] = rows
    return figures


def rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    """bench/run_all.py's rows: the new watch against the old, under each adopter of the rank."""
    out = []
    by = {(r["adopter"], r["watch"]): r for r in f["rows"]}
    for adopter in ADOPTERS:
        old, new = (by[(adopter, w)] for w in WATCHES)

        def shown(r: dict) -> str:
            if not r["ms"]["n"]:
                return f"never ended ({r['never_ended']}/{r['n']} within {f['give_up_s']:g} s)"
            never = f", {r['never_ended']}/{r['n']} never" if r["never_ended"] else ""
            return f"p50 {r['ms']['p50']:.0f} ms (max {r['ms']['max']:.0f} ms, n={r['ms']['n']}{never})"

        met = bool(new["ms"]["n"]) and not new["never_ended"] and new["ms"]["p50"] <= TARGET_P50_MS
        ratio = f"{old['ms']['p50'] / new['ms']['p50']:.0f}x" if old["ms"]["n"] and new["ms"]["n"] else ""
        out.append(
            (
                f"Detection of a SIGKILLed rank, kill -> the watch's exit ({f['path']}; its adopter: {adopter}; "
                f"heartbeat {f['heartbeat_s'] * 1000:g} ms)",
                f"new watch: {shown(new)}",
                f"old `tail --pid`: {shown(old)}",
                ratio,
                f"p50 <= {TARGET_P50_MS:g} ms",
                "yes" if met else "**no**",
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="kills per watch and adopter")
    parser.add_argument("--heartbeat", type=float, default=0.05, help="the watch's heartbeat, seconds")
    parser.add_argument("--give-up", type=float, default=3.0, help="seconds after the kill a watch counts as never")
    parser.add_argument("--local", action="store_true", help="a local bash even where sshd is installed")
    args = parser.parse_args()
    console = Console()
    figures = measure(args.samples, args.heartbeat, args.give_up, args.local, console)
    console.print(f"raw figures: {write_out('detect_zombie', figures)}")
    for row in rows(figures):
        console.print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
