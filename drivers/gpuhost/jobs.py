"""Jobs on a GPU host: start one in the background, read its state, signal and stop it, over SSH.

A job is started as

    CUDA_VISIBLE_DEVICES=0,1 TESTBED_JOB=NAME setsid env -C WORKDIR PROGRAM ARGS > LOG 2>&1 < /dev/null & echo $!

so its pid leads its own process group (stop and signal reach every process of the job) and it outlives
the SSH channel. WORKDIR and LOG are relative to the login directory unless absolute.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping
from typing import NamedTuple

from drivers.capabilities import JobHandle, JobStatus
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.gpuhost.reply import NUMBER, BadReply
from drivers.gpuhost.shell import HostShell

JOB_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SIGNALS = {"TERM", "KILL", "INT", "HUP", "STOP", "CONT", "USR1", "USR2", "QUIT"}
MARK = "--testbed-tail--"  # job_status: separates ps's answer from the log's tail
PS_STAT = re.compile(r"^[DIPRSTtWXZ][<NLsl+]*$")  # `ps -o stat=`: a state letter, then modifiers


class Launch(NamedTuple):
    """A job's folder, its log, and the command line that starts it."""

    workdir: str
    log: str
    line: str


def launch(
    command: list[str], name: str, gpus: list[int] | None, env: Mapping[str, str] | None, workdir: str | None
) -> Launch:
    """How `command` is started as job `name` (ValueError for a name, command or variable the line cannot hold)."""
    if not JOB_NAME.match(name):
        raise ValueError(f"job name {name!r}: use 1-64 letters, digits, '_', '.', '-'")
    if not command:
        raise ValueError("empty job command")
    workdir = workdir or f"testbed-jobs/{name}"
    log = f"{workdir}/{name}.log"
    assignments = {"TESTBED_JOB": name, **(env or {})}
    if gpus is not None:
        assignments["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in gpus)
    for key in assignments:
        if not VARIABLE.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key!r}")
    line = " ".join(
        [f"{k}={shlex.quote(str(v))}" for k, v in assignments.items()]
        + ["setsid", "env", "-C", shlex.quote(workdir)]
        + [shlex.quote(str(a)) for a in command]
        + [">", shlex.quote(log), "2>&1", "<", "/dev/null", "&", "echo", "$!"]
    )
    return Launch(workdir, log, line)


def started_pid(stdout: str) -> int | None:
    """The pid a background start (`... & echo $!`) printed; None unless it is one a group can be signalled by.

    pid 0 or 1 would make `kill -- -PID` signal the login's own group or every process.
    """
    text = stdout.strip()
    return int(text) if NUMBER.match(text) and int(text) > 1 else None


def has_exited(stat: str) -> bool:
    """Whether `ps -o stat=` says the process has exited: nothing (gone), a zombie (Z: dead, not yet reaped by
    its parent, which for a job started with setsid is PID 1 or a subreaper) or dead (X).
    """
    return not stat or stat[0] in "ZX"


def read_job_status(job: JobHandle, output: str, progress: str | None) -> JobStatus:
    """The job's state and progress from `ps -o stat= -p PID ; echo MARK ; tail -n N LOG`'s output.

    progress: a pattern searched in the tail's lines, last line first; its first group (or the whole match)
    is the progress.
    """
    stat, mark, tail = output.partition(MARK + "\n")
    stat = stat.strip()
    if not mark or (stat and not PS_STAT.match(stat)):
        raise BadReply(
            DeviceProtocolError,
            f"cannot read job {job.name!r}'s state (pid {job.pid}): expected ps's STAT code, then the line {MARK!r}",
            hint="the output was cut short or the host's ps is not procps (`ps -o stat= -p PID` must print "
            "a code like 'Ss' or nothing)",
        )
    if has_exited(stat):
        state = "exited"
    elif stat[0] in "Tt":
        state = "stopped"
    else:
        state = "running"
    lines = [line for line in tail.splitlines() if line.strip()]
    found = None
    if progress:
        rx = re.compile(progress)
        for line in reversed(lines):
            m = rx.search(line)
            if m:
                found = m.group(1) if m.groups() else m.group(0)
                break
    return JobStatus(job.pid, state, found, lines[-1] if lines else None)


def kill_command(pid: int, sig: str, group: bool) -> str:
    """`kill` sending SIG (a name, with or without SIG, or a number) to pid's process group or to pid alone."""
    sig = sig.upper().removeprefix("SIG")
    if sig not in SIGNALS and not sig.isdigit():
        raise ValueError(f"signal {sig!r}: use one of {sorted(SIGNALS)} or a number")
    target = f"-- -{int(pid)}" if group else str(int(pid))
    return f"kill -{sig} {target}"


class Jobs:
    """Start, read, signal and stop jobs on the host's shell."""

    def __init__(self, shell: HostShell) -> None:
        self.shell = shell

    def run(
        self,
        command: list[str],
        name: str,
        gpus: list[int] | None,
        env: Mapping[str, str] | None,
        workdir: str | None,
    ) -> JobHandle:
        how = launch(command, name, gpus, env, workdir)
        self.shell.exec(f"mkdir -p {shlex.quote(how.workdir)}")
        r = self.shell.exec(how.line, check=False)
        pid = started_pid(r.stdout)
        if r.status != 0 or pid is None:
            raise self.shell.error(
                DeviceCommandError,
                f"job {name!r} did not start (exit status {r.status}): {(r.stderr or r.stdout).strip()[:300]}",
                sent=how.line,
                received=r.stdout + r.stderr,
                hint=f"check that {command[0]!r} is installed on the host (and allowed, on an emulated host)",
            )
        return JobHandle(host=self.shell.device, name=name, pid=pid, log=how.log, workdir=how.workdir)

    def status(self, job: JobHandle, progress: str | None, tail_lines: int) -> JobStatus:
        r = self.shell.exec(
            f"ps -o stat= -p {int(job.pid)} ; echo {MARK} ; tail -n {int(tail_lines)} {shlex.quote(job.log)}",
            check=False,
        )
        try:
            return read_job_status(job, r.stdout, progress)
        except BadReply as bad:
            raise self.shell.rejected(
                bad, sent=r.command, received=r.stdout[-2000:] + r.stderr[-500:]
            ) from bad.__cause__

    def tail(self, path: str, lines: int) -> str:
        return self.shell.exec(f"tail -n {int(lines)} {shlex.quote(path)}").stdout

    def signal(self, pid: int, sig: str, group: bool) -> None:
        self.shell.exec(kill_command(pid, sig, group))

    def stop(self, job: JobHandle, grace_s: float, poll_s: float) -> str:
        r = self.shell.exec(f"kill -TERM -- -{int(job.pid)}", check=False)
        if r.status != 0:
            return "not running"
        self.shell.exec(f"kill -CONT -- -{int(job.pid)}", check=False)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.alive(job.pid):
                return "terminated"
            time.sleep(poll_s)
        self.shell.exec(f"kill -KILL -- -{int(job.pid)}", check=False)
        return "killed"

    def alive(self, pid: int) -> bool:
        """Whether pid is a process still running (a zombie is not)."""
        return not has_exited(self.shell.exec(f"ps -o stat= -p {int(pid)}", check=False).stdout.strip())
