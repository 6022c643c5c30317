"""The interpreter: one exec request's command line run command by command, as `bash -c` would run it.

Each simple command's words are expanded (`$!`, `$?`, `~`), then it runs as a built-in (builtins/) or as a job
program on the host's allowlist (jobs.py). Nothing else runs: an unknown word gives
`bash: X: command not found` (exit 127). A `while` loop runs its condition and body as lists of these, a group
`{ LIST ; }` its list; either put in the background (`&`) runs on a thread of its own, a subshell of the host
(GpuHostEngine.subshell), its output going where the command line's goes, each command's as it ends (as bash's
background subshell writes to the exec channel it inherited). A background job's output without redirections is
discarded (jobs.py).
"""

from __future__ import annotations

import os
import threading

from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.shell import jobs
from emulators.gpuhost.shell.builtins import BUILTINS
from emulators.gpuhost.shell.context import Context, PathEscape, Result
from emulators.gpuhost.shell.output import Stream, streamed
from emulators.gpuhost.shell.redirect import deliver
from emulators.gpuhost.shell.syntax import Loop, Segment, ShellSyntaxError, parse_line, parse_simple

SYNTAX_ERROR = 2  # bash's status for a command line it cannot parse
NOT_FOUND = 127
ENV_FAILED = 125  # env's own failure (its -C directory), before it runs anything
# Built-ins that are programs on a real host: in the foreground one runs here as a built-in (it prints nothing
# and is gone before the next command: only ps could tell), in the background it is a job like any program,
# if the host's allowlist has it.
PROGRAMS = {"sleep"}


class Shell:
    """The command language of one emulated host: what its SSH exec channels run."""

    def __init__(self, engine: GpuHostEngine) -> None:
        self.engine = engine

    def run(self, command: str, stream: Stream | None = None) -> Result:
        """Run one exec request; returns (stdout, stderr, exit status). With a stream, the output goes to
        it as it is produced and the returned stdout and stderr are empty.
        """
        # sshd hands the command to the shell as a C string: nothing after a NUL byte reaches it.
        command = command.partition("\0")[0]
        try:
            segments = parse_line(command)
        except ShellSyntaxError as exc:
            return "", f"bash: {exc}\n", SYNTAX_ERROR
        ctx = Context(engine=self.engine, cwd=self.engine.home, stream=stream)
        if stream is not None:
            ctx.out, ctx.err = streamed(stream)
        try:
            rc = self._list(segments, ctx)
        finally:
            if not ctx.cancelled():
                ctx.out.flush()
        return "".join(ctx.out), "".join(ctx.err), rc

    def _list(self, segments: list[Segment], ctx: Context) -> int:
        rc, prev = 0, None
        for segment in segments:
            if prev in (None, ";", "&") or (prev == "&&" and rc == 0) or (prev == "||" and rc != 0):
                if segment.loop is None and segment.group is None:
                    rc = self._simple(segment, ctx)
                elif segment.background:
                    rc = self._background(segment, ctx)
                elif segment.loop is not None:
                    rc = self._loop(segment.loop, ctx, ctx.ended)
                else:
                    rc = self._list(segment.group or [], ctx)
                ctx.status = rc
                if ctx.subshell and not ctx.cancelled():
                    ctx.out.flush()
            prev = segment.separator
            if ctx.exited:
                break
        return rc

    def _loop(self, loop: Loop, ctx: Context, ended: threading.Event) -> int:
        """`while`: its status is its body's last, 0 if the body never ran."""
        rc = 0
        while not ctx.cancelled() and not ended.is_set():
            if self._list(loop.condition, ctx) != 0 or ctx.exited:
                break
            rc = self._list(loop.body, ctx)
            if ctx.exited:
                break
        return rc

    def _background(self, segment: Segment, ctx: Context) -> int:
        """`while ... done &` or `{ ... ; } &`: it runs on as a subshell of the host; `$!` is its pid."""
        started = threading.Event()
        pid: list[int] = []

        def run() -> None:
            with self.engine.subshell() as (me, ended):
                pid.append(me)
                started.set()
                sub = Context(
                    engine=self.engine,
                    cwd=ctx.cwd,
                    last_bg=ctx.last_bg,
                    status=ctx.status,
                    ended=ended,
                    stream=ctx.stream,
                    subshell=True,
                )
                # where the command line's output goes: the exec channel as it comes, else what the line returns
                sub.out, sub.err = streamed(ctx.stream) if ctx.stream is not None else (ctx.out, ctx.err)
                if segment.loop is not None:
                    self._loop(segment.loop, sub, ended)
                else:
                    self._list(segment.group or [], sub)
                if not sub.cancelled():
                    sub.out.flush()

        threading.Thread(target=run, name="subshell", daemon=True).start()
        started.wait()
        ctx.last_bg = pid[0]
        return 0

    def _simple(self, segment: Segment, ctx: Context) -> int:
        try:
            command = parse_simple([expand(w, ctx) for w in segment.words])
        except ShellSyntaxError as exc:
            ctx.err.append(f"bash: {exc}\n")
            return SYNTAX_ERROR
        if not command.words:
            return 0
        cwd = ctx.cwd
        if command.chdir is not None:
            try:
                cwd = ctx.resolve(command.chdir)
            except PathEscape:
                ctx.err.append(f"env: cannot change directory to '{command.chdir}': Permission denied\n")
                return ENV_FAILED
            if not os.path.isdir(cwd):
                ctx.err.append(f"env: cannot change directory to '{command.chdir}': No such file or directory\n")
                return ENV_FAILED
        name, args = command.words[0], command.words[1:]
        builtin = None if segment.background and name in PROGRAMS else BUILTINS.get(name)
        if builtin is not None:
            try:
                out, err, rc = builtin(args, ctx)
            except OSError as exc:
                if ctx.cancelled():
                    raise  # the client went away while the builtin wrote to it: the server ends the session
                # The file system refused what the builtin did not expect (a name too long, ...): say so as
                # the tool would, with a status; an OSError reaching the SSH server means "client gone".
                ctx.err.append(f"{name}: {exc.strerror or exc}\n")
                return 1
            return deliver(out, err, rc, command.redirections, ctx)
        if "/" in name:
            ctx.err.append(f"bash: {name}: No such file or directory\n")
            return NOT_FOUND
        program = self.engine.program_path(name)
        if program is None:
            ctx.err.append(f"bash: {name}: command not found\n")
            return NOT_FOUND
        return jobs.start(program, command, cwd, ctx, segment.background)


def expand(word: str, ctx: Context) -> str:
    """A word with the expansions this shell knows: `$!`, `$?`, and `~` at its start."""
    if word == "$!":
        return str(ctx.last_bg) if ctx.last_bg is not None else ""
    if word == "$?":
        return str(ctx.status)
    if word == "~" or word.startswith("~/"):
        return str(ctx.home) + word[1:]
    return word
