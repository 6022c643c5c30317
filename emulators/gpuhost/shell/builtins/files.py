"""The host's files, inside its home: cd, pwd, mkdir, cat, ls; and how a tool reads one file.

The one file outside the home a tool may read is /proc/PID/stat of a process of the host (its jobs, and the
command lines' background loops): the kernel's own line for it, a zombie's included, except that a job that has
exited reads as sleeping until its output is in its log (emulators/gpuhost/joblog.py). Deviation: any other
process's is missing, as on a host that runs nothing else.
"""

from __future__ import annotations

import os
import re

from emulators.gpuhost.host import job_stat
from emulators.gpuhost.shell.context import Context, PathEscape, Result


def cd(args: list[str], ctx: Context) -> Result:
    target = args[0] if args else str(ctx.home)
    try:
        path = ctx.resolve(target)
    except PathEscape:
        return "", f"bash: cd: {target}: Permission denied\n", 1
    if not os.path.isdir(path):
        return "", f"bash: cd: {target}: No such file or directory\n", 1
    ctx.cwd = path
    return "", "", 0


def pwd(args: list[str], ctx: Context) -> Result:
    return str(ctx.cwd) + "\n", "", 0


def mkdir(args: list[str], ctx: Context) -> Result:
    parents = "-p" in args or "--parents" in args
    err, rc = "", 0
    for d in (a for a in args if not a.startswith("-")):
        try:
            path = ctx.resolve(d)
            path.mkdir(parents=parents, exist_ok=parents)
        except PathEscape:
            err, rc = err + f"mkdir: cannot create directory '{d}': Permission denied\n", 1
        except FileExistsError:
            err, rc = err + f"mkdir: cannot create directory '{d}': File exists\n", 1
        except FileNotFoundError:
            err, rc = err + f"mkdir: cannot create directory '{d}': No such file or directory\n", 1
    return "", err, rc


PROC_STAT = re.compile(r"/proc/([0-9]{1,18})/stat")


def read_file(tool: str, name: str, ctx: Context) -> tuple[bytes | None, str]:
    """The bytes of file `name`; or None and the message `tool` prints when it cannot read it."""
    proc = PROC_STAT.fullmatch(name)
    if proc is not None:
        return _proc_stat(tool, name, int(proc.group(1)), ctx)
    try:
        path = ctx.resolve(name)
    except PathEscape:
        return None, f"{tool}: {name}: Permission denied\n"
    if os.path.isdir(path):  # not Path.is_dir: it raises on a name too long
        return None, f"{tool}: {name}: Is a directory\n"
    try:
        return path.read_bytes(), ""
    except FileNotFoundError:
        return None, f"{tool}: {name}: No such file or directory\n"
    except OSError as exc:
        return None, f"{tool}: {name}: {exc.strerror}\n"


def cat(args: list[str], ctx: Context) -> Result:
    out, err, rc = [], "", 0
    for name in args:
        data, e = read_file("cat", name, ctx)
        if data is None:
            err, rc = err + e, 1
        else:
            out.append(data.decode(errors="replace"))
    return "".join(out), err, rc


def ls(args: list[str], ctx: Context) -> Result:
    names = [a for a in args if not a.startswith("-")] or ["."]
    out, err, rc = [], "", 0
    for name in names:
        try:
            path = ctx.resolve(name)
        except PathEscape:
            err, rc = err + f"ls: cannot open directory '{name}': Permission denied\n", 2
            continue
        if os.path.isdir(path):
            out.extend(sorted(p.name for p in path.iterdir()))
        elif os.path.exists(path):
            out.append(name)
        else:
            err, rc = err + f"ls: cannot access '{name}': No such file or directory\n", 2
    return "".join(n + "\n" for n in out), err, rc


def _proc_stat(tool: str, name: str, pid: int, ctx: Context) -> tuple[bytes | None, str]:
    engine = ctx.engine
    job = engine.jobs.get(pid)
    if job is not None or pid in engine.live_subshells():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                line = f.read()
        except OSError:
            pass  # reaped meanwhile
        else:
            return (line if job is None else job_stat(job, line)), ""
    return None, f"{tool}: {name}: No such file or directory\n"
