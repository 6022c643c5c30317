"""Redirections carried out: a built-in's output written where its redirections send it, and the files a job
program's redirections open. Every target resolves inside the host's home; /dev/null is the one exception.
"""

from __future__ import annotations

import subprocess

from emulators.gpuhost.shell.context import Context, PathEscape
from emulators.gpuhost.shell.syntax import Redirections

DEV_NULL = "/dev/null"


def deliver(out: str, err: str, rc: int, r: Redirections, ctx: Context) -> int:
    """Send a built-in's output where `r` says; its exit status, or 1 if a redirection could not be made."""
    if r.stdout_to_stderr:
        out, err = "", out + err
    if r.stderr_to_stdout and r.stdout is None:
        out, err = out + err, ""
    try:
        if r.stdout is not None:
            write(r.stdout, out + (err if r.stderr_to_stdout else ""), ctx)
            out = ""
            if r.stderr_to_stdout:
                err = ""
        if r.stderr is not None:
            write(r.stderr, err, ctx)
            err = ""
    except PathEscape as exc:
        ctx.err.append(f"bash: {exc}: Permission denied\n")
        return 1
    except OSError as exc:
        ctx.err.append(f"bash: {exc.filename}: {exc.strerror}\n")
        return 1
    ctx.out.append(out)
    ctx.err.append(err)
    return rc


def write(target: tuple[str, bool], text: str, ctx: Context) -> None:
    """Write `text` to a (path, append) target."""
    path, append = target
    if path == DEV_NULL:
        return
    with open(ctx.resolve(path), "a" if append else "w") as f:
        f.write(text)


def open_target(target: tuple[str, bool] | None, ctx: Context, default):
    """The file a job's output goes to (the caller closes it), or `default` when not redirected."""
    if target is None:
        return default
    path, append = target
    if path == DEV_NULL:
        return subprocess.DEVNULL
    return open(ctx.resolve(path), "ab" if append else "wb")  # noqa: SIM115 - closed by caller


def open_stdin(path: str | None, ctx: Context):
    """A job's standard input: the file `< path` names (the caller closes it), else nothing."""
    if path in (None, DEV_NULL):
        return subprocess.DEVNULL
    return open(ctx.resolve(path), "rb")  # noqa: SIM115 - closed by caller
