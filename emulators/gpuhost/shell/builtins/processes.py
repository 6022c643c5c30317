"""The host's processes, which are its jobs alone: kill, ps, pgrep.

Only the jobs this host started are seen: any other pid is, to `kill`, someone else's process (or none). A
command line's background loop (a subshell) can be killed too; ps and pgrep list jobs alone.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

from emulators.gpuhost.host import Job, _proc_state, job_state
from emulators.gpuhost.shell.context import Context, Result

# Signals a background loop (a subshell) ignores: any other ends it. Deviation: SIGSTOP ends it too.
SUBSHELL_IGNORES = {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH}
KILL_USAGE = "kill: usage: kill [-s sigspec | -n signum | -sigspec] pid | jobspec ... or kill -l [sigspec]\n"


def kill(args: list[str], ctx: Context) -> Result:
    sig, sig_given = signal.SIGTERM, False
    targets: list[str] = []
    it = iter(args)
    for a in it:
        if targets or a == "--":
            if a != "--":
                targets.append(a)
            continue
        if a in ("-s", "-n"):
            a = "-" + next(it, "")
        if a == "-l":
            return " ".join(s.name[3:] for s in signal.Signals) + "\n", "", 0
        if a.startswith("-") and len(a) > 1 and not sig_given:
            sig_given = True
            name = a[1:].upper()
            try:
                if re.fullmatch(r"[0-9]{1,3}", name):
                    sig = signal.Signals(int(name))
                else:
                    sig = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
            except (KeyError, ValueError):
                return "", f"bash: kill: {a[1:]}: invalid signal specification\n", 1
            continue
        targets.append(a)
    if not targets:
        return "", KILL_USAGE, 2
    jobs = _jobs_by_pid(ctx)
    err, rc = "", 0
    for t in targets:
        if not re.fullmatch(r"-?\d{1,18}", t):  # bash refuses what does not fit its intmax_t, too
            err, rc = err + f"bash: kill: {t}: arguments must be process or job IDs\n", 1
            continue
        n = int(t)
        if n > 0 and n in ctx.engine.live_subshells():
            if sig not in SUBSHELL_IGNORES:
                ctx.engine.live_subshells()[n].set()
            continue
        job = jobs.get(abs(n))
        if job is None:
            reason = "Operation not permitted" if _exists(abs(n)) else "No such process"
            err, rc = err + f"bash: kill: ({t}) - {reason}\n", 1
            continue
        try:
            t_ns = time.monotonic_ns()
            if n < 0:
                os.killpg(job.pid, sig)
            else:
                os.kill(job.pid, sig)
            ctx.engine.record_truth("signal", t_ns, pid=job.pid, group=n < 0, signal=sig.name)
        except ProcessLookupError:
            err, rc = err + f"bash: kill: ({t}) - No such process\n", 1
    return "", err, rc


def ps(args: list[str], ctx: Context) -> Result:
    fields: list[str] = []
    pids: set[int] | None = None
    header = True
    it = iter(args)
    for a in it:
        if a in ("-o", "--format", "-O"):
            fields += next(it, "").split(",")
        elif a.startswith("-o") and len(a) > 2:
            fields += a[2:].split(",")
        elif a in ("-p", "--pid", "-q"):
            pids = _pid_list(next(it, ""), pids)
        elif a.startswith("-p") and len(a) > 2:
            pids = _pid_list(a[2:], pids)
        elif a in ("--no-headers", "--no-heading", "h"):
            header = False
        elif a in ("-u", "-U", "-g", "-G"):
            next(it, "")
        # -e, -A, -f, aux, ax, ...: this host's view holds only its own jobs anyway
    if not fields:
        fields = ["pid", "tty", "time", "cmd"]
    fields = [f for f in (f.strip() for f in fields) if f]
    named = [(f[:-1], False) if f.endswith("=") else (f, True) for f in fields]
    for f, _ in named:
        if f.lower() not in PS_FIELDS:
            return "", f'error: unknown user-defined format specifier "{f}"\n', 1
    header = header and any(h for _, h in named)
    jobs = sorted(_jobs_by_pid(ctx).values(), key=lambda j: j.pid)
    if pids is not None:
        jobs = [j for j in jobs if j.pid in pids]
    rows = [[PS_FIELDS[f.lower()][1](j) for f, _ in named] for j in jobs]
    lines = []
    if header:
        lines.append(_ps_line([PS_FIELDS[f.lower()][0] if h else "" for f, h in named], named))
    lines += [_ps_line(r, named) for r in rows]
    return "".join(line.rstrip() + "\n" for line in lines), "", 0 if rows or pids is None else 1


def pgrep(args: list[str], ctx: Context) -> Result:
    full = list_name = list_full = False
    patterns = []
    for a in args:
        if a.startswith("-") and len(a) > 1:
            full |= "f" in a
            list_name |= "l" in a
            list_full |= "a" in a
        else:
            patterns.append(a)
    if len(patterns) != 1:
        return "", "pgrep: no matching criteria specified\nTry `pgrep --help' for more information.\n", 2
    try:
        rx = re.compile(patterns[0])
    except re.error as exc:
        return "", f"pgrep: invalid regular expression: {exc}\n", 2
    out = []
    for j in sorted(_jobs_by_pid(ctx).values(), key=lambda j: j.pid):
        comm, cmdline = os.path.basename(j.argv[0])[:15], " ".join(j.argv)
        if rx.search(cmdline if full else comm):
            out.append(f"{j.pid} {cmdline}" if list_full else f"{j.pid} {comm}" if list_name else str(j.pid))
    return "".join(o + "\n" for o in out), "", 0 if out else 1


def _jobs_by_pid(ctx: Context) -> dict[int, Job]:
    return {j.pid: j for j in ctx.engine.live_jobs()}


def _exists(pid: int) -> bool:
    return _proc_state(pid) is not None


def _pid_list(text: str, prev: set[int] | None) -> set[int]:
    out = set(prev or ())
    for part in re.split(r"[,\s]+", text.strip()):
        if re.fullmatch(r"[0-9]{1,18}", part):  # not str.isdigit(): int('²') fails
            out.add(int(part))
    return out


def _etime(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h:02d}:{m:02d}:{s:02d}"
    return f"{m:02d}:{s:02d}"


def _stat(j: Job) -> str:
    return (job_state(j) or "?") + "s"  # every job leads its own session


# ps's output fields: name -> (header, value of a job)
PS_FIELDS: dict[str, tuple[str, Callable[[Job], str]]] = {
    "pid": ("PID", lambda j: str(j.pid)),
    "ppid": ("PPID", lambda j: "1"),
    "pgid": ("PGID", lambda j: str(j.pid)),
    "pgrp": ("PGRP", lambda j: str(j.pid)),
    "sid": ("SID", lambda j: str(j.pid)),
    "stat": ("STAT", _stat),
    "state": ("S", lambda j: job_state(j) or "?"),
    "s": ("S", lambda j: job_state(j) or "?"),
    "etime": ("ELAPSED", lambda j: _etime(time.monotonic() - j.started)),
    "etimes": ("ELAPSED", lambda j: str(int(time.monotonic() - j.started))),
    "comm": ("COMMAND", lambda j: os.path.basename(j.argv[0])[:15]),
    "ucomm": ("COMMAND", lambda j: os.path.basename(j.argv[0])[:15]),
    "args": ("COMMAND", lambda j: " ".join(j.argv)),
    "cmd": ("CMD", lambda j: " ".join(j.argv)),
    "command": ("COMMAND", lambda j: " ".join(j.argv)),
    "tty": ("TT", lambda j: "?"),
    "time": ("TIME", lambda j: "00:00:00"),
}
_RIGHT = {"pid", "ppid", "pgid", "pgrp", "sid", "etime", "etimes"}


def _ps_line(values: list[str], named: list[tuple[str, bool]]) -> str:
    cells = []
    for v, (f, _) in zip(values, named, strict=True):
        f = f.lower()
        if f in ("args", "cmd", "command"):
            cells.append(v)
        elif f in _RIGHT:
            cells.append(v.rjust(7 if f in ("pid", "ppid", "pgid", "pgrp", "sid") else 11))
        else:
            cells.append(v.ljust(4))
    return " ".join(cells)
