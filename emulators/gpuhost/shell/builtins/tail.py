"""`tail`: the end (or, with +N, the rest from line or byte N) of one or more files, or one file followed as
it grows (follow.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from emulators.gpuhost.shell.builtins.files import read_file
from emulators.gpuhost.shell.builtins.follow import follow
from emulators.gpuhost.shell.context import Context, Result

NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits only: '²'.isdigit() is true, int('²') fails


class TailRefusal(Exception):
    """A command line tail refuses; its message is what tail prints."""


@dataclass
class TailOptions:
    files: list[str] = field(default_factory=list)
    lines: int = 10
    nbytes: int | None = None  # -c: bytes instead of lines
    from_start: bool = False  # +N: from line (byte) N on, instead of the last N
    follow: str | None = None  # "descriptor" (-f) or "name" (--follow=name, -F)
    retry: bool = False
    interval: float = 1.0  # -s: seconds between checks of a followed file's writer (--pid)
    pid: int | None = None

    def part(self, data: bytes) -> bytes:
        """What `tail -n N` / `-n +N` / `-c N` / `-c +N` prints of `data`."""
        if self.nbytes is not None:
            n = self.nbytes
            return data[max(n - 1, 0) :] if self.from_start else (data[-n:] if n else b"")
        parts = data.splitlines(keepends=True)
        n = self.lines
        return b"".join(parts[max(n - 1, 0) :] if self.from_start else (parts[-n:] if n else []))


def parse_options(args: list[str]) -> TailOptions:
    """GNU tail's options as this host takes them; TailRefusal for what it does not."""
    o = TailOptions()
    it = iter(args)
    for a in it:
        if a in ("-f", "--follow", "--follow=descriptor"):
            o.follow = "descriptor"
            continue
        if a in ("-F", "--follow=name"):
            o.follow, o.retry = "name", o.retry or a == "-F"
            continue
        if a == "--retry":
            o.retry = True
            continue
        if a in ("-s", "--sleep-interval") or a.startswith("--sleep-interval=") or re.fullmatch(r"-s.+", a):
            v = next(it, "") if a in ("-s", "--sleep-interval") else a.split("=", 1)[1] if "=" in a else a[2:]
            try:
                o.interval = float(v)
            except ValueError:
                raise TailRefusal(f"tail: invalid number of seconds: '{v}'\n") from None
            if not o.interval >= 0:
                raise TailRefusal(f"tail: invalid number of seconds: '{v}'\n")
            continue
        if a == "--pid" or a.startswith("--pid="):
            v = next(it, "") if a == "--pid" else a.split("=", 1)[1]
            if not NUMBER.fullmatch(v):
                raise TailRefusal(f"tail: invalid PID: '{v}'\n")
            o.pid = int(v)
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
            raise TailRefusal(f"tail: unrecognized option '{a}'\nTry 'tail --help' for more information.\n")
        else:
            o.files.append(a)
            continue
        start = v.startswith("+")
        if not NUMBER.fullmatch(v.lstrip("+")):
            raise TailRefusal(f"tail: invalid number of lines: '{v}'\n")
        if a.startswith("-c") or a.startswith("--bytes"):
            o.nbytes, o.from_start = int(v.lstrip("+")), start
        else:
            o.lines, o.from_start = int(v.lstrip("+")), start
    if not o.files:
        raise TailRefusal("tail: reading standard input is not supported on the emulated host\n")
    if o.follow is not None and len(o.files) != 1:
        raise TailRefusal("tail: following more than one file is not supported on the emulated host\n")
    return o


def tail(args: list[str], ctx: Context) -> Result:
    try:
        o = parse_options(args)
    except TailRefusal as exc:
        return "", str(exc), 1
    if o.follow is not None:
        return follow(
            o.files[0], o.part, by_name=o.follow == "name", retry=o.retry, interval=o.interval, pid=o.pid, ctx=ctx
        )
    out: list[str] = []
    err, rc = "", 0
    for name in o.files:
        data, e = read_file("tail", name, ctx)
        if data is None:
            err, rc = err + e, 1
            continue
        if len(o.files) > 1:
            out.append(f"{'' if not out else chr(10)}==> {name} <==\n")
        out.append(o.part(data).decode(errors="replace"))
    return "".join(out), err, rc
