"""The restricted command language of an emulated GPU host: what an SSH exec channel may run.

A command line is split with shlex into simple commands joined by `&&`, `||`, `;` and `&` (operators
must stand apart from words, as the driver writes them). A simple command is
`[NAME=VALUE ...] [setsid|nohup|env [-C DIR] [NAME=VALUE ...]] WORD ARGS [> F | >> F | 2> F | 2>&1 | &> F | < F]`
and WORD is either a builtin below or a job program on the host's allowlist, started as a real child
process. Builtins: nvidia-smi, dmesg, journalctl -k, kill, ps, pgrep, cat, tail, ls, mkdir, cd, echo,
true, false, hostname, whoami, pwd, exit. Nothing else runs: an unknown word gives
`bash: X: command not found` (exit 127). Every path must resolve inside the host's private home.
Deviation from bash: a background job without redirections gets /dev/null, not the channel.
"""

from __future__ import annotations

import os
import re
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
REDIRECTS = ("2>&1", ">&2", "1>&2", ">>", "2>>", "&>", ">", "1>", "2>", "<")


class _PathEscape(Exception):
    pass


@dataclass
class _State:
    cwd: Path
    last_bg: int | None = None
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    exited: bool = False


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

    def run(self, command: str) -> Result:
        """Run one exec request; returns (stdout, stderr, exit status)."""
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
        st = _State(cwd=self.home)
        rc, prev = 0, None
        for words, sep in segments:
            if prev in (None, ";", "&") or (prev == "&&" and rc == 0) or (prev == "||" and rc != 0):
                rc = self._simple(words, st, background=(sep == "&"))
            prev = sep
            if st.exited:
                break
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
            if not cwd.is_dir():
                st.err.append(f"env: cannot change directory to '{chdir}': No such file or directory\n")
                return 125
        name, args = words[0], words[1:]
        if name in self.builtins:
            out, err, rc = self.builtins[name](args, st)
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
        out, err = job.proc.communicate()
        st.out.append((out or b"").decode(errors="replace"))
        st.err.append((err or b"").decode(errors="replace"))
        return job.proc.returncode if job.proc.returncode >= 0 else 128 - job.proc.returncode

    # --- builtins ------------------------------------------------------------------------------

    def _echo(self, args: list[str], st: _State) -> Result:
        newline = "\n"
        if args and args[0] == "-n":
            args, newline = args[1:], ""
        return " ".join(args) + newline, "", 0

    def _exit(self, args: list[str], st: _State) -> Result:
        st.exited = True
        return "", "", int(args[0]) if args and args[0].isdigit() else 0

    def _cd(self, args: list[str], st: _State) -> Result:
        target = args[0] if args else str(self.home)
        try:
            path = self.resolve(target, st.cwd)
        except _PathEscape:
            return "", f"bash: cd: {target}: Permission denied\n", 1
        if not path.is_dir():
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
        if path.is_dir():
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
        it = iter(args)
        for a in it:
            if a in ("-n", "--lines", "-c", "--bytes"):
                v = next(it, "")
            elif a.startswith("--lines=") or a.startswith("--bytes="):
                v = a.split("=", 1)[1]
            elif a.startswith("-n") or a.startswith("-c"):
                v = a[2:]
            elif re.fullmatch(r"-\d+", a):
                a, v = "-n", a[1:]
            elif a in ("-f", "-F", "--follow"):
                return "", "tail: following is not supported on the emulated host\n", 1
            elif a == "-q":
                continue
            else:
                files.append(a)
                continue
            start = v.startswith("+")
            if not v.lstrip("+").isdigit():
                return "", f"tail: invalid number of lines: '{v}'\n", 1
            if a.startswith("-c") or a.startswith("--bytes"):
                nbytes, from_start = int(v.lstrip("+")), start
            else:
                lines, from_start = int(v.lstrip("+")), start
        if not files:
            return "", "tail: reading standard input is not supported on the emulated host\n", 1
        out, err, rc = [], "", 0
        for name in files:
            data, e = self._read("tail", name, st)
            if data is None:
                err, rc = err + e, 1
                continue
            if len(files) > 1:
                out.append(f"{'' if not out else chr(10)}==> {name} <==\n")
            if nbytes is not None:
                chunk = data[max(nbytes - 1, 0) :] if from_start else (data[-nbytes:] if nbytes else b"")
            else:
                parts = data.splitlines(keepends=True)
                chunk = b"".join(parts[max(lines - 1, 0) :] if from_start else (parts[-lines:] if lines else []))
            out.append(chunk.decode(errors="replace"))
        return "".join(out), err, rc

    def _ls(self, args: list[str], st: _State) -> Result:
        names = [a for a in args if not a.startswith("-")] or ["."]
        out, err, rc = [], "", 0
        for name in names:
            try:
                path = self.resolve(name, st.cwd)
            except _PathEscape:
                err, rc = err + f"ls: cannot open directory '{name}': Permission denied\n", 2
                continue
            if path.is_dir():
                out.extend(sorted(p.name for p in path.iterdir()))
            elif path.exists():
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
                    if name.isdigit():
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
            if not re.fullmatch(r"-?\d+", t):
                err, rc = err + f"bash: kill: {t}: arguments must be process or job IDs\n", 1
                continue
            n = int(t)
            job = jobs.get(abs(n))
            if job is None:
                reason = "Operation not permitted" if _exists(abs(n)) else "No such process"
                err, rc = err + f"bash: kill: ({t}) - {reason}\n", 1
                continue
            try:
                if n < 0:
                    os.killpg(job.pid, sig)
                else:
                    os.kill(job.pid, sig)
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


def _split(command: str) -> list[str]:
    tokens = []
    for tok in shlex.split(command, comments=False, posix=True):
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


def _exists(pid: int) -> bool:
    return _proc_state(pid) is not None


def _pid_list(text: str, prev: set[int] | None) -> set[int]:
    out = set(prev or ())
    for part in re.split(r"[,\s]+", text.strip()):
        if part.isdigit():
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
