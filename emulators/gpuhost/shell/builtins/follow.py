"""`tail -f/-F FILE`: one file followed as it grows, in the manner of GNU coreutils on Linux.

`tail [-n N|+N] [-s SECONDS] [--pid=PID] -F FILE` prints the file's end, then what is appended to it, and with
--pid exits 0 once PID is gone, after a last read of the file. With -F (follow by name) a file replaced under
the same name is followed anew, and a name that goes away is waited for.
Deviation: --pid sees only this host's jobs and background loops (any other pid counts as gone).
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable

from emulators.gpuhost.shell.builtins.files import read_file
from emulators.gpuhost.shell.context import Context, PathEscape, Result

# How often a followed file is checked for data nobody announced. A job's output, which the host copies into
# its log file, wakes `tail -F` at once (as inotify would); only other writers wait for this poll.
FILE_POLL_S = 0.02


def follow(
    name: str,
    initial: Callable[[bytes], bytes],
    *,
    by_name: bool,
    retry: bool,
    interval: float,
    pid: int | None,
    ctx: Context,
) -> Result:
    """Print `initial` of the file's content, then what is appended to it until the reader goes away or (with
    a pid) that process is gone: then read the file a last time and exit 0 (GNU tail's --pid).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    engine = ctx.engine
    fh, ino, pos, missing = None, None, 0, False

    def reopen() -> None:
        nonlocal fh, ino, pos
        try:
            path = ctx.resolve(name)
            new = open(path, "rb")  # noqa: SIM115 - closed below
        except (PathEscape, OSError):
            return
        if fh is not None:
            fh.close()
        fh, ino, pos = new, os.fstat(new.fileno()).st_ino, 0

    reopen()
    if fh is None:
        _, e = read_file("tail", name, ctx)
        ctx.err.append(e.replace(f"tail: {name}:", f"tail: cannot open '{name}' for reading:"))
        if not retry:
            ctx.err.append("tail: no files remaining\n")
            return "", "", 1
        missing = True
    else:
        data = fh.read()
        pos = len(data)
        ctx.out.append(decoder.decode(initial(data)))
    # The timing model is GNU tail on Linux (inotify): appended data is reported at once (a job's output,
    # which the host copies into its log file, wakes this loop; other writes are found within
    # FILE_POLL_S), and the pid is checked after each batch of data and when -s seconds pass without
    # any; once it is gone the file is read a last time and tail exits 0.
    interval = max(interval, 0.001)
    next_pid_check = 0.0
    gone = False
    try:
        while not ctx.cancelled():
            seen = engine.appended_count  # before reading: an append after this wakes the wait below
            data = b""
            if fh is not None:
                if os.fstat(fh.fileno()).st_size < pos:
                    ctx.err.append(f"tail: {name}: file truncated\n")
                    pos = 0
                fh.seek(pos)
                data = fh.read()
                pos += len(data)
                if data:
                    ctx.out.append(decoder.decode(data))
            ctx.out.flush()  # what was appended goes out now (with any message before it)
            if gone:  # this was the last read after the writer died
                ctx.out.append(decoder.decode(b"", final=True))
                return "", "", 0
            # -F looks the name up after passing on the data, as GNU tail drains a replaced file before
            # following the new one: resolving the path costs a stat per component, and a step line
            # (the end of a measured failover) must not wait for it.
            if by_name:
                try:
                    current = os.stat(ctx.resolve(name)).st_ino
                except (PathEscape, OSError):
                    current = None
                if current is None and fh is not None and not missing:
                    ctx.err.append(f"tail: '{name}' has become inaccessible: No such file or directory\n")
                    missing = True
                elif current is not None and current != ino:
                    was = "has appeared" if fh is None or missing else "has been replaced"
                    reopen()
                    if fh is not None and ino == current:
                        ctx.err.append(f"tail: '{name}' {was};  following new file\n")
                        missing = False
                        continue  # read the new file at once
            now = time.monotonic()
            if pid is not None and (data or now >= next_pid_check):
                gone = pid not in engine.live_subshells() and not any(j.pid == pid for j in engine.live_jobs())
                next_pid_check = now + interval
                if gone:
                    continue  # read once more, at once
            ctx.out.flush()
            with engine.appended:  # a job's output reaching its log file wakes this at once
                if engine.appended_count == seen:
                    # Sleep until data is announced, the next poll, or the next pid check (GNU tail checks
                    # the writer every -s seconds), whichever comes first.
                    due = next_pid_check - time.monotonic() if pid is not None else FILE_POLL_S
                    engine.appended.wait(min(FILE_POLL_S, max(due, 0.0005)))
        return "", "", 0
    finally:
        if fh is not None:
            fh.close()
