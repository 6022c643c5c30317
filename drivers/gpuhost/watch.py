"""The failure watch: a running job's log followed on one SSH channel, without polling from here, until its
process has exited.

    { while grep -sqE ALIVE /proc/PID/stat ; do sleep 0.05 ; done ; echo GONE >&2 ; } &
    tail -n 0 -s 0.01 --pid $! -F LOG ; exit $?

GNU tail prints each new log line as it is written and, with --pid, exits 0 once that process is gone, after a
last read of the log. It is not given the job's pid: tail's check (kill -0) counts a zombie as running, and a
job started with setsid that dies is reaped by PID 1 (or the nearest subreaper) when that gets round to it,
which on a container whose PID 1 never reaps is never. The loop before it reads the job's state in
/proc/PID/stat every heartbeat and ends once the job is a zombie (Z), dead (X) or gone; tail follows the loop
instead, which the login shell reaps as soon as it ends. `; exit $?` keeps tail from being exec'd in the
shell's place (bash -c does that to a line's last command): tail would then inherit the loop and never reap it.
The loop says GONE on stderr the moment it sees the job gone, so the exit is known without waiting for tail's next
check of the loop and its last read (`gone`, then the log's last lines, then `exited`): a failure is detected
within a heartbeat of the job's death, not a heartbeat and a tail check. `follow` turns tail's output into
progress / line / idle / gone / exited events timestamped on receipt.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator

from drivers.capabilities import JobHandle, WatchEvent
from drivers.errors import DeviceCommandError
from drivers.gpuhost.reply import NUMBER
from drivers.gpuhost.shell import HostShell

# /proc/PID/stat is "PID (COMM) STATE ..." and every field after the state is a number, so the state is the one
# letter between the last ") " and an all-numeric rest of the line (COMM may itself hold ") " and letters).
ALIVE = r"\) [^ZX]( -?[0-9]+)+$"
TAIL_CHECKS = 5  # how many times a heartbeat tail checks whether the loop has ended
GONE = "testbed-watch: gone"  # what the loop prints on stderr once the job's process is gone


def alive_test(pid: int) -> str:
    """A command that exits 0 while pid runs (a zombie does not): 1 for a zombie or dead process, 2 once gone."""
    return f"grep -sqE {shlex.quote(ALIVE)} /proc/{int(pid)}/stat"


def watch_command(job: JobHandle, heartbeat_s: float, lines: int | None) -> str:
    """The loop and `tail` that follow the job's log until it exits (lines: how many existing lines first, None
    for all).
    """
    first = "+1" if lines is None else str(int(lines))
    # The loop reads the state once a heartbeat (a grep and a sleep started each time); tail's check of the loop
    # is a system call, made TAIL_CHECKS times as often, so the exit is seen within about one heartbeat.
    return (
        f"{{ while {alive_test(job.pid)} ; do sleep {heartbeat_s:g} ; done ; echo {shlex.quote(GONE)} >&2 ; }} & "
        f"tail -n {first} -s {heartbeat_s / TAIL_CHECKS:g} --pid $! -F {shlex.quote(job.log)} ; exit $?"
    )


def line_event(raw: bytes, rx: re.Pattern | None, ns: int) -> WatchEvent:
    """A log line as an event: "progress" with its step number if rx finds it (its first group, or the
    whole match; the step is None unless that is a number), else "line".
    """
    line = raw.decode("utf-8", errors="backslashreplace").rstrip("\r")
    m = rx.search(line) if rx is not None else None
    if m is None:
        return WatchEvent("line", line, None, ns)
    text = m.group(1) if m.groups() else m.group(0)
    return WatchEvent("progress", line, int(text) if NUMBER.match(text) else None, ns)


def follow(
    shell: HostShell, job: JobHandle, *, heartbeat_s: float, progress: str | None, lines: int | None
) -> Generator[WatchEvent, None, None]:
    """GpuHostSsh.watch: the job's log lines as they arrive, an idle per silent heartbeat, "gone" when the loop saw
    the process end, then (after the log's last lines) "exited".
    """
    if not heartbeat_s > 0:
        raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
    rx = re.compile(progress) if progress else None
    command = watch_command(job, heartbeat_s, lines)
    pending, errors, gone = b"", "", False
    for chunk in shell.transport.stream(command, idle_s=heartbeat_s):
        if chunk.kind == "out":
            end = -len(pending)  # where each line's newline is in this chunk: the line's time is its arrival
            *complete, pending = (pending + chunk.data).split(b"\n")
            for raw in complete:
                end += len(raw) + 1
                yield line_event(raw, rx, chunk.arrival_ns(end - 1))
        elif chunk.kind == "err":
            errors = (errors + chunk.data.decode("utf-8", errors="backslashreplace"))[-2000:]
            if not gone and GONE in errors:
                gone = True
                errors = errors.replace(GONE + "\n", "")
                yield WatchEvent("gone", None, None, chunk.mono_ns)
        elif chunk.kind == "idle":
            yield WatchEvent("idle", None, None, chunk.mono_ns)
        elif chunk.kind == "exit":
            if pending:
                yield line_event(pending, rx, chunk.mono_ns)
            if chunk.status == 0:
                if not gone:  # a host whose loop said nothing (its stderr lost): the exit is the news
                    yield WatchEvent("gone", None, None, chunk.mono_ns)
                yield WatchEvent("exited", None, None, chunk.mono_ns)
                return
            raise shell.error(
                DeviceCommandError,
                f"the watch on job {job.name!r} (pid {job.pid}) ended with exit status {chunk.status}: "
                f"{errors.strip()[:300]}",
                sent=command,
                received=errors,
                hint="the host needs GNU coreutils tail and sleep (--pid, -F, fractional -s; busybox tail lacks "
                "--pid), grep -E and Linux's /proc",
            )
