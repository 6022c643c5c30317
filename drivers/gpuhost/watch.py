"""The failure watch: a running job's log followed on one SSH channel, without polling, until its process is gone.

    tail -n 0 -s 0.05 --pid=PID -F LOG

(GNU coreutils) prints each new log line as it is written and exits 0 once PID is gone, checking every
-s seconds; `follow` turns that into progress / line / idle / exited events timestamped on receipt.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator

from drivers.capabilities import JobHandle, WatchEvent
from drivers.errors import DeviceCommandError
from drivers.gpuhost.reply import NUMBER
from drivers.gpuhost.shell import HostShell


def watch_command(job: JobHandle, heartbeat_s: float, lines: int | None) -> str:
    """The `tail` that follows the job's log (lines: how many existing lines first, None for all)."""
    first = "+1" if lines is None else str(int(lines))
    return f"tail -n {first} -s {heartbeat_s:g} --pid={int(job.pid)} -F {shlex.quote(job.log)}"


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
    """GpuHostSsh.watch: the job's log lines as they arrive, an idle per silent heartbeat, then "exited"."""
    if not heartbeat_s > 0:
        raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
    rx = re.compile(progress) if progress else None
    command = watch_command(job, heartbeat_s, lines)
    pending, errors = b"", ""
    for chunk in shell.transport.stream(command, idle_s=heartbeat_s):
        if chunk.kind == "out":
            end = -len(pending)  # where each line's newline is in this chunk: the line's time is its arrival
            *complete, pending = (pending + chunk.data).split(b"\n")
            for raw in complete:
                end += len(raw) + 1
                yield line_event(raw, rx, chunk.arrival_ns(end - 1))
        elif chunk.kind == "err":
            errors = (errors + chunk.data.decode("utf-8", errors="backslashreplace"))[-2000:]
        elif chunk.kind == "idle":
            yield WatchEvent("idle", None, None, chunk.mono_ns)
        elif chunk.kind == "exit":
            if pending:
                yield line_event(pending, rx, chunk.mono_ns)
            if chunk.status == 0:
                yield WatchEvent("exited", None, None, chunk.mono_ns)
                return
            raise shell.error(
                DeviceCommandError,
                f"the watch on job {job.name!r} (pid {job.pid}) ended with exit status {chunk.status}: "
                f"{errors.strip()[:300]}",
                sent=command,
                received=errors,
                hint="the host needs GNU coreutils tail (--pid, -F, fractional -s); busybox tail lacks --pid",
            )
