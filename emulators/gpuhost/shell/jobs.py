"""A job program started as a real child process of the host: its redirections opened, then either left
running in the background (`$!` is its pid) or waited for in the foreground, its output passed on as it comes.

Deviation from bash: a background job without redirections gets /dev/null, not the channel.
"""

from __future__ import annotations

import codecs
import os
import selectors
import subprocess
from pathlib import Path

from emulators.gpuhost.shell.context import Context, PathEscape
from emulators.gpuhost.shell.redirect import DEV_NULL, open_stdin, open_target
from emulators.gpuhost.shell.syntax import SimpleCommand

CLIENT_GONE = 255  # the status of a foreground job whose reader hung up (sshd's, for a lost connection)


def start(program: str, command: SimpleCommand, cwd: Path, ctx: Context, background: bool) -> int:
    """Run the allowlisted `program` as `command` says; the exit status as bash reports it."""
    r = command.redirections
    opened = []
    try:
        stdin = open_stdin(r.stdin, ctx)
        opened.append(stdin)
        default = subprocess.DEVNULL if background else subprocess.PIPE
        stdout = open_target(r.stdout, ctx, default)
        opened.append(stdout)
        if r.stderr_to_stdout:
            stderr = subprocess.STDOUT
        else:
            stderr = open_target(r.stderr, ctx, default)
            opened.append(stderr)
    except PathEscape as exc:
        _close(opened)
        ctx.err.append(f"bash: {exc}: Permission denied\n")
        return 1
    except OSError as exc:
        _close(opened)
        ctx.err.append(f"bash: {exc.filename}: {exc.strerror}\n")
        return 1
    log = None
    if r.stdout is not None and r.stdout[0] != DEV_NULL:
        log = os.path.relpath(ctx.resolve(r.stdout[0]), ctx.home)
    engine = ctx.engine
    try:
        job = engine.spawn(
            command.words,
            program,
            cwd=cwd,
            env=engine.job_env(command.assignments),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            log=log,
        )
    except OSError as exc:
        ctx.err.append(f"bash: {command.words[0]}: {exc.strerror}\n")
        return 126
    finally:
        _close(opened)
    if background:
        ctx.last_bg = job.pid
        return 0
    if not pump(job.proc, ctx):
        return CLIENT_GONE
    job.proc.wait()
    if job.copier is not None:  # its output is in the file before the command line returns
        job.copier.join()
    return job.proc.returncode if job.proc.returncode >= 0 else 128 - job.proc.returncode


def pump(proc: subprocess.Popen, ctx: Context) -> bool:
    """Forward a foreground process's stdout and stderr as they are written, until both pipes close.
    False if the reader went away first (its pipes are then closed: the process gets SIGPIPE).
    """
    pipes = [(f, sink) for f, sink in ((proc.stdout, ctx.out), (proc.stderr, ctx.err)) if f is not None]
    try:
        with selectors.DefaultSelector() as sel:
            for f, sink in pipes:
                sel.register(f, selectors.EVENT_READ, (sink, codecs.getincrementaldecoder("utf-8")(errors="replace")))
            while sel.get_map():
                for key, _ in sel.select(0.5):
                    sink, decoder = key.data
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    sink.append(decoder.decode(chunk, final=not chunk))
                    sink.flush()  # a foreground process's output streams
                if ctx.cancelled():
                    return False
        return True
    finally:
        for f, _ in pipes:
            f.close()


def _close(files: list) -> None:
    for f in files:
        if hasattr(f, "close"):
            f.close()
