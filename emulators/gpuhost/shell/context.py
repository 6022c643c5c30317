"""What every command of one command line shares: the host, the working directory, `$!` and `$?`, the
outputs; and the one rule of paths on an emulated host, that they resolve inside the host's private home.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.shell.output import Output, Stream

Result = tuple[str, str, int]  # (stdout, stderr, exit status)


class PathEscape(Exception):
    """A path that resolves outside the host's home; its message is the path as given."""


@dataclass
class Context:
    """One command line's state, handed to every built-in it runs."""

    engine: GpuHostEngine
    cwd: Path
    last_bg: int | None = None  # $!: the pid of the last background job
    status: int = 0  # $?: the exit status of the last command
    out: Output = field(default_factory=Output)
    err: Output = field(default_factory=Output)
    exited: bool = False
    stream: Stream | None = None
    ended: threading.Event = field(default_factory=threading.Event)  # set when a subshell running this is killed
    subshell: bool = False  # a background loop or group: its output is flushed as each command ends

    @property
    def home(self) -> Path:
        return self.engine.home

    def cancelled(self) -> bool:
        """Whether the reader of a streamed command line went away."""
        return self.stream is not None and self.stream.closed()

    def resolve(self, path: str) -> Path:
        """`path`, relative to the working directory, with its links resolved; PathEscape if that is outside
        the home.
        """
        p = Path(path)
        if not p.is_absolute():
            p = self.cwd / p
        real = Path(os.path.realpath(p))
        if real != self.home and self.home not in real.parents:
            raise PathEscape(path)
        return real


Builtin = Callable[[list[str], Context], Result]
