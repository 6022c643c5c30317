"""The restricted command language of an emulated GPU host: what an SSH exec channel may run.

A command line is split with shlex into simple commands joined by `&&`, `||`, `;` and `&` (operators
must stand apart from words, as the driver writes them). A simple command is
`[NAME=VALUE ...] [setsid|nohup|env [-C DIR] [NAME=VALUE ...]] WORD ARGS [> F | >> F | 2> F | 2>&1 | &> F | < F]`
and WORD is either a builtin below or a job program on the host's allowlist, started as a real child
process. Builtins: nvidia-smi, dmesg, journalctl -k, kill, ps, pgrep, cat, tail, ls, mkdir, cd, echo,
true, false, hostname, whoami, pwd, exit. Nothing else runs: an unknown word gives
`bash: X: command not found` (exit 127). Every path must resolve inside the host's private home.
Deviation from bash: a background job without redirections gets /dev/null, not the channel.

Output streams: given a `Stream` (an exec channel), what a command prints is sent as it is produced (a
foreground job's pipes, `tail -f` lines), not when the command line ends. `tail -f/-F` follows one file
in the manner of GNU coreutils: `tail [-n N|+N] [-s SECONDS] [--pid=PID] -F FILE` polls the file every
-s seconds (default 1) and, with --pid, exits 0 once PID is gone, after a last read of the file.
Deviation: --pid sees only this host's jobs (any other pid counts as gone).
"""

from __future__ import annotations

import codecs
import os
import re
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from emulators.gpuhost.host import GpuHostEngine, Job, _proc_state
from emulators.gpuhost.nvsmi import nvidia_smi

OPERATORS = ("&&", "||", ";", "&")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# How often a followed file is checked for data nobody announced. A job's output, which the host copies into
# its log file, wakes `tail -F` at once (as inotify would); only other writers wait for this poll.
FILE_POLL_S = 0.02
REDIRECTS = ("2>&1", ">&2", "1>&2", ">>", "2>>", "&>", ">", "1>", "2>", "<")


class _PathEscape(Exception):
    pass


@dataclass
class Stream:
    """Where output goes as it is produced, and whether anyone still reads it (the exec channel)."""

    out: Callable[[str], None]
    err: Callable[[str], None]
    closed: Callable[[], bool] = lambda: False


class _Sink(list):
    """Collects text; or, for an exec's stream, queues it in `pending` (shared by stdout and stderr, so the
    order between them holds) until flush() hands it to the stream's writers.

    A command line's quick commands (`nvidia-smi ...; echo ...; dmesg`) thus reach the client in one SSH
    packet, as from sshd reading the shell's pipe after they wrote; what streams (`tail -f`, a foreground
    process) flushes each piece as it comes.
    """

    def __init__(self, write: Callable[[str], None] | None = None, pending: list | None = None) -> None:
        super().__init__()
        self.write = write
        self.pending = pending if pending is not None else []

    def append(self, text: str) -> None:
        if not text:
            return
        if self.write is None:
            super().append(text)
        else:
            self.pending.append((self, text))

    def flush(self) -> None:
        pending = self.pending
        while pending:
            sink, run = pending[0][0], 0
            while run < len(pending) and pending[run][0] is sink:
                run += 1
            text = "".join(t for _, t in pending[:run])
            del pending[:run]
            assert sink.write is not None
            sink.write(text)


@dataclass
class _State:
    cwd: Path
    last_bg: int | None = None
    status: int = 0  # $?: the exit status of the last command
    out: _Sink = field(default_factory=_Sink)
    err: _Sink = field(default_factory=_Sink)
    exited: bool = False
    stream: Stream | None = None

    def cancelled(self) -> bool:
        return self.stream is not None and self.stream.closed()


@dataclass
class _Redirs:
    stdout: tuple[str, bool] | None = None  # (path, append)
    stderr: tuple[str, bool] | None = None
    stderr_to_stdout: bool = False
    stdout_to_stderr: bool = False
    stdin: str | None = None


Result = tuple[str, str, int]


class Shell:
    def __init__(self, engine: GpuHostEngine) -> None:
        self.engine = engine
        self.home = engine.home
        self.builtins: dict[str, Callable[[list[str], _State], Result]] = {
            "nvidia-smi": lambda a, s: nvidia_smi(a, self.engine.view()),
            "dmesg": self._dmesg,
            "journalctl": self._journalctl,
            "kill": self._kill,
            "ps": self._ps,
            "pgrep": self._pgrep,
            "cat": self._cat,
            "tail": self._tail,
            "ls": self._ls,
            "mkdir": self._mkdir,
            "cd": self._cd,
            "echo": self._echo,
            "true": lambda a, s: ("", "", 0),
            "false": lambda a, s: ("", "", 1),
            "hostname": lambda a, s: (self.engine.spec.name + "\n", "", 0),
            "whoami": lambda a, s: (self.engine.spec.user + "\n", "", 0),
            "pwd": lambda a, s: (str(s.cwd) + "\n", "", 0),
            "exit": self._exit,
        }

    # --- the command line ----------------------------------------------------------------------

    def run(self, command: str, stream: Stream | None = None) -> Result:
        """Run one exec request; returns (stdout, stderr, exit status). With a stream, the output goes to
        it as it is produced and the returned stdout and stderr are empty.
        """
        # sshd hands the command to the shell as a C string: nothing after a NUL byte reaches it.
        command = command.partition("\0")[0]
        try:
            tokens = _split(command)
        except ValueError as exc:
            return "", f"bash: -c: line 1: syntax error: {exc}\n", 2
        segments: list[tuple[list[str], str | None]] = []
        words: list[str] = []
        for tok in tokens:
            if tok in OPERATORS:
                if not words:
                    return "", f"bash: -c: line 1: syntax error near unexpected token `{tok}'\n", 2
                segments.append((words, tok))
                words = []
            elif tok in ("|", "||&", "|&", "$(", "`"):
                return "", f"bash: emulated host: `{tok}' is not supported\n", 2
            else:
                words.append(tok)
        if words:
            segments.append((words, None))
        st = _State(cwd=self.home, stream=stream)
        if stream is not None:
            pending: list = []
            st.out, st.err = _Sink(stream.out, pending), _Sink(stream.err, pending)
        rc, prev = 0, None
        try:
            for words, sep in segments:
                if prev in (None, ";", "&") or (prev == "&&" and rc == 0) or (prev == "||" and rc != 0):
                    rc = st.status = self._simple(words, st, background=(sep == "&"))
                prev = sep
                if st.exited:
                    break
        finally:
            if not st.cancelled():
                st.out.flush()
        return "".join(st.out), "".join(st.err), rc

    def _simple(self, words: list[str], st: _State, background: bool) -> int:
        words = [self._expand(w, st) for w in words]
        try:
            assignments, words, redirs, chdir = _parse_simple(words)
        except ValueError as exc:
            st.err.append(f"bash: {exc}\n")
            return 2
        if not words:
            return 0
        cwd = st.cwd
        if chdir is not None:
            try:
                cwd = self.resolve(chdir, st.cwd)
            except _PathEscape:
                st.err.append(f"env: cannot change directory to '{chdir}': Permission denied\n")
                return 125
            if not os.path.isdir(cwd):
                st.err.append(f"env: cannot change directory to '{chdir}': No such file or directory\n")
                return 125
        name, args = words[0], words[1:]
        if name in self.builtins:
            try:
                out, err, rc = self.builtins[name](args, st)
            except OSError as exc:
                if st.cancelled():
                    raise  # the client went away while the builtin wrote to it: the server ends the session
                # The file system refused what the builtin did not expect (a name too long, ...): say so as
                # the tool would, with a status; an OSError reaching the SSH server means "client gone".
                st.err.append(f"{name}: {exc.strerror or exc}\n")
                return 1
            return self._deliver(out, err, rc, redirs, st)
        if "/" in name:
            st.err.append(f"bash: {name}: No such file or directory\n")
            return 127
        program = self.engine.program_path(name)
        if program is None:
            st.err.append(f"bash: {name}: command not found\n")
            return 127
        return self._start(program, words, assignments, redirs, cwd, st, background)

    def _expand(self, word: str, st: _State) -> str:
        if word == "$!":
            return str(st.last_bg) if st.last_bg is not None else ""
        if word == "$?":
            return str(st.status)
        if word == "~" or word.startswith("~/"):
            return str(self.home) + word[1:]
        return word

    def resolve(self, path: str, cwd: Path) -> Path:
        p = Path(path)
        if not p.is_absolute():
            p = cwd / p
        real = Path(os.path.realpath(p))
        if real != self.home and self.home not in real.parents:
            raise _PathEscape(path)
        return real

    def _deliver(self, out: str, err: str, rc: int, r: _Redirs, st: _State) -> int:
        if r.stdout_to_stderr:
            out, err = "", out + err
        if r.stderr_to_stdout and r.stdout is None:
            out, err = out + err, ""
        try:
            if r.stdout is not None:
                self._write(r.stdout, out + (err if r.stderr_to_stdout else ""), st)
                out = ""
                if r.stderr_to_stdout:
                    err = ""
            if r.stderr is not None:
                self._write(r.stderr, err, st)
                err = ""
        except _PathEscape as exc:
            st.err.append(f"bash: {exc}: Permission denied\n")
            return 1
        except OSError as exc:
            st.err.append(f"bash: {exc.filename}: {exc.strerror}\n")
            return 1
        st.out.append(out)
        st.err.append(err)
        return rc

    def _write(self, target: tuple[str, bool], text: str, st: _State) -> None:
        path, append = target
        if path == "/dev/null":
            return
        with open(self.resolve(path, st.cwd), "a" if append else "w") as f:
            f.write(text)

    def _open(self, target: tuple[str, bool] | None, st: _State, default):
        if target is None:
            return default
        path, append = target
        if path == "/dev/null":
            return subprocess.DEVNULL
        return open(self.resolve(path, st.cwd), "ab" if append else "wb")  # noqa: SIM115 - closed by caller

    def _start(
        self,
        program: str,
        argv: list[str],
        assignments: dict[str, str],
        r: _Redirs,
        cwd: Path,
        st: _State,
        background: bool,
    ) -> int:
        opened = []
        try:
            if r.stdin not in (None, "/dev/null"):
                stdin = open(self.resolve(r.stdin, st.cwd), "rb")  # noqa: SIM115
            else:
                stdin = subprocess.DEVNULL
            opened.append(stdin)
            default = subprocess.DEVNULL if background else subprocess.PIPE
            stdout = self._open(r.stdout, st, default)
            opened.append(stdout)
            if r.stderr_to_stdout:
                stderr = subprocess.STDOUT
            else:
                stderr = self._open(r.stderr, st, default)
                opened.append(stderr)
        except _PathEscape as exc:
            st.err.append(f"bash: {exc}: Permission denied\n")
            return 1
        except OSError as exc:
            st.err.append(f"bash: {exc.filename}: {exc.strerror}\n")
            return 1
        log = None
        if r.stdout is not None and r.stdout[0] != "/dev/null":
            log = os.path.relpath(self.resolve(r.stdout[0], st.cwd), self.home)
        try:
            job = self.engine.spawn(
                argv,
                program,
                cwd=cwd,
                env=self.engine.job_env(assignments),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                log=log,
            )
        except OSError as exc:
            st.err.append(f"bash: {argv[0]}: {exc.strerror}\n")
            return 126
        finally:
            for f in opened:
                if hasattr(f, "close"):
                    f.close()
        if background:
            st.last_bg = job.pid
            return 0
        if not _pump(job.proc, st):
            return 255
        job.proc.wait()
        if job.copier is not None:  # its output is in the file before the command line returns
            job.copier.join()
        return job.proc.returncode if job.proc.returncode >= 0 else 128 - job.proc.returncode

    # --- builtins ------------------------------------------------------------------------------

    def _echo(self, args: list[str], st: _State) -> Result:
        newline = "\n"
        if args and args[0] == "-n":
            args, newline = args[1:], ""
        return " ".join(args) + newline, "", 0

    def _exit(self, args: list[str], st: _State) -> Result:
        st.exited = True
        if not args:
            return "", "", 0
        # ASCII digits only ('²'.isdigit() is true, int('²') fails); the status is a byte, as in bash.
        if not re.fullmatch(r"-?[0-9]{1,18}", args[0]):
            return "", f"bash: exit: {args[0]}: numeric argument required\n", 2
        return "", "", int(args[0]) % 256

    def _cd(self, args: list[str], st: _State) -> Result:
        target = args[0] if args else str(self.home)
        try:
            path = self.resolve(target, st.cwd)
        except _PathEscape:
            return "", f"bash: cd: {target}: Permission denied\n", 1
        if not os.path.isdir(path):
            return "", f"bash: cd: {target}: No such file or directory\n", 1
        st.cwd = path
        return "", "", 0

    def _mkdir(self, args: list[str], st: _State) -> Result:
        parents = "-p" in args or "--parents" in args
        err, rc = "", 0
        for d in (a for a in args if not a.startswith("-")):
            try:
                path = self.resolve(d, st.cwd)
                path.mkdir(parents=parents, exist_ok=parents)
            except _PathEscape:
                err, rc = err + f"mkdir: cannot create directory '{d}': Permission denied\n", 1
            except FileExistsError:
                err, rc = err + f"mkdir: cannot create directory '{d}': File exists\n", 1
            except FileNotFoundError:
                err, rc = err + f"mkdir: cannot create directory '{d}': No such file or directory\n", 1
        return "", err, rc

    def _read(self, tool: str, name: str, st: _State) -> tuple[bytes | None, str]:
        try:
            path = self.resolve(name, st.cwd)
        except _PathEscape:
            return None, f"{tool}: {name}: Permission denied\n"
        if os.path.isdir(path):  # not Path.is_dir: it raises on a name too long
            return None, f"{tool}: {name}: Is a directory\n"
        try:
            return path.read_bytes(), ""
        except FileNotFoundError:
            return None, f"{tool}: {name}: No such file or directory\n"
        except OSError as exc:
            return None, f"{tool}: {name}: {exc.strerror}\n"

    def _cat(self, args: list[str], st: _State) -> Result:
        out, err, rc = [], "", 0
        for name in args:
            data, e = self._read("cat", name, st)
            if data is None:
                err, rc = err + e, 1
            else:
                out.append(data.decode(errors="replace"))
        return "".join(out), err, rc

    def _tail(self, args: list[str], st: _State) -> Result:
        lines, nbytes, from_start, files = 10, None, False, []
        follow: str | None = None  # "descriptor" (-f) or "name" (--follow=name, -F)
        retry, interval, pid = False, 1.0, None
        it = iter(args)
        for a in it:
            if a in ("-f", "--follow", "--follow=descriptor"):
                follow = "descriptor"
                continue
            if a in ("-F", "--follow=name"):
                follow, retry = "name", retry or a == "-F"
                continue
            if a == "--retry":
                retry = True
                continue
            if a in ("-s", "--sleep-interval") or a.startswith("--sleep-interval=") or re.fullmatch(r"-s.+", a):
                v = next(it, "") if a in ("-s", "--sleep-interval") else a.split("=", 1)[1] if "=" in a else a[2:]
                try:
                    interval = float(v)
                except ValueError:
                    return "", f"tail: invalid number of seconds: '{v}'\n", 1
                if not interval >= 0:
                    return "", f"tail: invalid number of seconds: '{v}'\n", 1
                continue
            if a == "--pid" or a.startswith("--pid="):
                v = next(it, "") if a == "--pid" else a.split("=", 1)[1]
                if not re.fullmatch(r"[0-9]{1,18}", v):  # ASCII digits: int('²') fails
                    return "", f"tail: invalid PID: '{v}'\n", 1
                pid = int(v)
                continue
            if a in ("-n", "--lines", "-c", "--bytes"):
                v = next(it, "")
            elif a.startswith("--lines=") or a.startswith("--bytes="):
                v = a.split("=", 1)[1]
            elif a.startswith("-n") or a.startswith("-c"):
                v = a[2:]
            elif re.fullmatch(r"-\d+", a):
                a, v = "-n", a[1:]
            elif a == "-q":
                continue
            elif a.startswith("-") and len(a) > 1:
                return "", f"tail: unrecognized option '{a}'\nTry 'tail --help' for more information.\n", 1
            else:
                files.append(a)
                continue
            start = v.startswith("+")
            if not re.fullmatch(r"[0-9]{1,18}", v.lstrip("+")):
                return "", f"tail: invalid number of lines: '{v}'\n", 1
            if a.startswith("-c") or a.startswith("--bytes"):
                nbytes, from_start = int(v.lstrip("+")), start
            else:
                lines, from_start = int(v.lstrip("+")), start
        if not files:
            return "", "tail: reading standard input is not supported on the emulated host\n", 1
        if follow is not None:
            if len(files) != 1:
                return "", "tail: following more than one file is not supported on the emulated host\n", 1
            return self._follow(
                files[0],
                lambda data: _tail_part(data, lines, nbytes, from_start),
                follow == "name",
                retry,
                interval,
                pid,
                st,
            )
        out, err, rc = [], "", 0
        for name in files:
            data, e = self._read("tail", name, st)
            if data is None:
                err, rc = err + e, 1
                continue
            if len(files) > 1:
                out.append(f"{'' if not out else chr(10)}==> {name} <==\n")
            out.append(_tail_part(data, lines, nbytes, from_start).decode(errors="replace"))
        return "".join(out), err, rc

    def _follow(
        self,
        name: str,
        initial: Callable[[bytes], bytes],
        by_name: bool,
        retry: bool,
        interval: float,
        pid: int | None,
        st: _State,
    ) -> Result:
        """`tail -f/-F FILE`: print the initial part, then every `interval` seconds what was appended. With
        a pid: once that process is gone, read the file a last time and exit 0 (GNU tail's --pid).
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fh, ino, pos, missing = None, None, 0, False

        def reopen() -> None:
            nonlocal fh, ino, pos
            try:
                path = self.resolve(name, st.cwd)
                new = open(path, "rb")  # noqa: SIM115 - closed below
            except (_PathEscape, OSError):
                return
            if fh is not None:
                fh.close()
            fh, ino, pos = new, os.fstat(new.fileno()).st_ino, 0

        reopen()
        if fh is None:
            _, e = self._read("tail", name, st)
            st.err.append(e.replace(f"tail: {name}:", f"tail: cannot open '{name}' for reading:"))
            if not retry:
                st.err.append("tail: no files remaining\n")
                return "", "", 1
            missing = True
        else:
            data = fh.read()
            pos = len(data)
            st.out.append(decoder.decode(initial(data)))
        # The timing model is GNU tail on Linux (inotify): appended data is reported at once (a job's output,
        # which the host copies into its log file, wakes this loop; other writes are found within
        # FILE_POLL_S), and the pid is checked after each batch of data and when -s seconds pass without
        # any; once it is gone the file is read a last time and tail exits 0.
        interval = max(interval, 0.001)
        next_pid_check = 0.0
        gone = False
        try:
            while not st.cancelled():
                seen = self.engine.appended_count  # before reading: an append after this wakes the wait below
                data = b""
                if fh is not None:
                    if os.fstat(fh.fileno()).st_size < pos:
                        st.err.append(f"tail: {name}: file truncated\n")
                        pos = 0
                    fh.seek(pos)
                    data = fh.read()
                    pos += len(data)
                    if data:
                        st.out.append(decoder.decode(data))
                st.out.flush()  # what was appended goes out now (with any message before it)
                if gone:  # this was the last read after the writer died
                    st.out.append(decoder.decode(b"", final=True))
                    return "", "", 0
                # -F looks the name up after passing on the data, as GNU tail drains a replaced file before
                # following the new one: resolving the path costs a stat per component, and a step line
                # (the end of a measured failover) must not wait for it.
                if by_name:
                    try:
                        current = os.stat(self.resolve(name, st.cwd)).st_ino
                    except (_PathEscape, OSError):
                        current = None
                    if current is None and fh is not None and not missing:
                        st.err.append(f"tail: '{name}' has become inaccessible: No such file or directory\n")
                        missing = True
                    elif current is not None and current != ino:
                        was = "has appeared" if fh is None or missing else "has been replaced"
                        reopen()
                        if fh is not None and ino == current:
                            st.err.append(f"tail: '{name}' {was};  following new file\n")
                            missing = False
                            continue  # read the new file at once
                now = time.monotonic()
                if pid is not None and (data or now >= next_pid_check):
                    gone = not any(j.pid == pid for j in self.engine.live_jobs())
                    next_pid_check = now + interval
                    if gone:
                        continue  # read once more, at once
                st.out.flush()
                with self.engine.appended:  # a job's output reaching its log file wakes this at once
                    if self.engine.appended_count == seen:
                        # Sleep until data is announced, the next poll, or the next pid check (GNU tail checks
                        # the writer every -s seconds), whichever comes first.
                        due = next_pid_check - time.monotonic() if pid is not None else FILE_POLL_S
                        self.engine.appended.wait(min(FILE_POLL_S, max(due, 0.0005)))
            return "", "", 0
        finally:
            if fh is not None:
                fh.close()

    def _ls(self, args: list[str], st: _State) -> Result:
        names = [a for a in args if not a.startswith("-")] or ["."]
        out, err, rc = [], "", 0
        for name in names:
            try:
                path = self.resolve(name, st.cwd)
            except _PathEscape:
                err, rc = err + f"ls: cannot open directory '{name}': Permission denied\n", 2
                continue
            if os.path.isdir(path):
                out.extend(sorted(p.name for p in path.iterdir()))
            elif os.path.exists(path):
                out.append(name)
            else:
                err, rc = err + f"ls: cannot access '{name}': No such file or directory\n", 2
        return "".join(n + "\n" for n in out), err, rc

    def _dmesg(self, args: list[str], st: _State) -> Result:
        with self.engine.lock:
            k = self.engine.kernel
            lines = list(k.lines)
        human = any(a in ("-T", "--ctime") for a in args)
        out = []
        for t, msg in lines:
            if human:
                out.append(f"[{time.strftime('%a %b %e %H:%M:%S %Y', time.localtime(k.boot_wall + t))}] {msg}\n")
            else:
                out.append(f"[{t:12.6f}] {msg}\n")
        return "".join(out), "", 0

    def _journalctl(self, args: list[str], st: _State) -> Result:
        if not any(a in ("-k", "--dmesg") or (a.startswith("-") and not a.startswith("--") and "k" in a) for a in args):
            return "-- No entries --\n", "", 0
        with self.engine.lock:
            k = self.engine.kernel
            lines = list(k.lines)
        host = self.engine.spec.name
        return (
            "".join(
                f"{time.strftime('%b %d %H:%M:%S', time.localtime(k.boot_wall + t))} {host} kernel: {msg}\n"
                for t, msg in lines
            ),
            "",
            0,
        )

    def _jobs_by_pid(self) -> dict[int, Job]:
        return {j.pid: j for j in self.engine.live_jobs()}

    def _kill(self, args: list[str], st: _State) -> Result:
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
            return (
                "",
                "kill: usage: kill [-s sigspec | -n signum | -sigspec] pid | jobspec ... or kill -l [sigspec]\n",
                2,
            )
        jobs = self._jobs_by_pid()
        err, rc = "", 0
        for t in targets:
            if not re.fullmatch(r"-?\d{1,18}", t):  # bash refuses what does not fit its intmax_t, too
                err, rc = err + f"bash: kill: {t}: arguments must be process or job IDs\n", 1
                continue
            n = int(t)
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
                self.engine.record_truth("signal", t_ns, pid=job.pid, group=n < 0, signal=sig.name)
            except ProcessLookupError:
                err, rc = err + f"bash: kill: ({t}) - No such process\n", 1
        return "", err, rc

    def _ps(self, args: list[str], st: _State) -> Result:
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
        jobs = sorted(self._jobs_by_pid().values(), key=lambda j: j.pid)
        if pids is not None:
            jobs = [j for j in jobs if j.pid in pids]
        rows = [[PS_FIELDS[f.lower()][1](j) for f, _ in named] for j in jobs]
        lines = []
        if header:
            lines.append(_ps_line([PS_FIELDS[f.lower()][0] if h else "" for f, h in named], named))
        lines += [_ps_line(r, named) for r in rows]
        return "".join(line.rstrip() + "\n" for line in lines), "", 0 if rows or pids is None else 1

    def _pgrep(self, args: list[str], st: _State) -> Result:
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
        for j in sorted(self._jobs_by_pid().values(), key=lambda j: j.pid):
            comm, cmdline = os.path.basename(j.argv[0])[:15], " ".join(j.argv)
            if rx.search(cmdline if full else comm):
                out.append(f"{j.pid} {cmdline}" if list_full else f"{j.pid} {comm}" if list_name else str(j.pid))
        return "".join(o + "\n" for o in out), "", 0 if out else 1


_QUOTING = re.compile(r"[\"'\\]")
_BLANKS = re.compile(r"[ \t\r\n]+")  # shlex's whitespace; str.split() would also split on \x0b, \xa0, ...


def _words(command: str) -> list[str]:
    """shlex.split(command, posix=True), without its character-by-character scan when there is no quoting
    to interpret (a health probe's command line is 200 characters, and 64 hosts share one twin).
    """
    if _QUOTING.search(command):
        return shlex.split(command, comments=False, posix=True)
    return [w for w in _BLANKS.split(command) if w]


def _split(command: str) -> list[str]:
    tokens = []
    for tok in _words(command):
        if len(tok) > 1 and tok.endswith(";") and not tok.endswith("\\;"):
            tokens += [tok[:-1], ";"]
        else:
            tokens.append(tok)
    return tokens


def _parse_simple(words: list[str]) -> tuple[dict[str, str], list[str], _Redirs, str | None]:
    r = _Redirs()
    rest: list[str] = []
    it = iter(words)
    for w in it:
        op = next((o for o in REDIRECTS if w.startswith(o)), None)
        if op is None:
            rest.append(w)
            continue
        if op in ("2>&1", ">&2", "1>&2"):
            if w != op:
                rest.append(w)
                continue
            if op == "2>&1":
                r.stderr_to_stdout = True
            else:
                r.stdout_to_stderr = True
            continue
        target = w[len(op) :] or next(it, None)
        if not target:
            raise ValueError("syntax error near unexpected token `newline'")
        if op == "<":
            r.stdin = target
        elif op in (">", "1>", ">>"):
            r.stdout = (target, op == ">>")
        elif op in ("2>", "2>>"):
            r.stderr = (target, op == "2>>")
        elif op == "&>":
            r.stdout, r.stderr_to_stdout = (target, False), True
    assignments: dict[str, str] = {}
    i = 0
    while i < len(rest) and ASSIGNMENT.match(rest[i]):
        k, _, v = rest[i].partition("=")
        assignments[k] = v
        i += 1
    chdir = None
    while i < len(rest) and rest[i] in ("setsid", "nohup", "env", "exec"):
        if rest[i] == "env":
            i += 1
            while i < len(rest):
                if rest[i] in ("-C", "--chdir") and i + 1 < len(rest):
                    chdir, i = rest[i + 1], i + 2
                elif rest[i].startswith("--chdir="):
                    chdir, i = rest[i].split("=", 1)[1], i + 1
                elif ASSIGNMENT.match(rest[i]):
                    k, _, v = rest[i].partition("=")
                    assignments[k] = v
                    i += 1
                else:
                    break
        else:
            i += 1
            if i < len(rest) and rest[i - 1] == "setsid" and rest[i] in ("-f", "--fork", "-w", "--wait"):
                i += 1
    return assignments, rest[i:], r, chdir


def _tail_part(data: bytes, lines: int, nbytes: int | None, from_start: bool) -> bytes:
    """What `tail -n N` / `-n +N` / `-c N` / `-c +N` prints of `data`."""
    if nbytes is not None:
        return data[max(nbytes - 1, 0) :] if from_start else (data[-nbytes:] if nbytes else b"")
    parts = data.splitlines(keepends=True)
    return b"".join(parts[max(lines - 1, 0) :] if from_start else (parts[-lines:] if lines else []))


def _pump(proc: subprocess.Popen, st: _State) -> bool:
    """Forward a foreground process's stdout and stderr as they are written, until both pipes close.
    False if the reader went away first (its pipes are then closed: the process gets SIGPIPE).
    """
    pipes = [(f, sink) for f, sink in ((proc.stdout, st.out), (proc.stderr, st.err)) if f is not None]
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
                if st.cancelled():
                    return False
        return True
    finally:
        for f, _ in pipes:
            f.close()


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
    return (_proc_state(j.pid) or "?") + "s"  # every job leads its own session


PS_FIELDS: dict[str, tuple[str, Callable[[Job], str]]] = {
    "pid": ("PID", lambda j: str(j.pid)),
    "ppid": ("PPID", lambda j: "1"),
    "pgid": ("PGID", lambda j: str(j.pid)),
    "pgrp": ("PGRP", lambda j: str(j.pid)),
    "sid": ("SID", lambda j: str(j.pid)),
    "stat": ("STAT", _stat),
    "state": ("S", lambda j: _proc_state(j.pid) or "?"),
    "s": ("S", lambda j: _proc_state(j.pid) or "?"),
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
