"""Where a command line's output goes: collected for the caller, or streamed to an exec channel as it comes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Stream:
    """Where output goes as it is produced, and whether anyone still reads it (the exec channel)."""

    out: Callable[[str], None]
    err: Callable[[str], None]
    closed: Callable[[], bool] = lambda: False


class Output(list):
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


def streamed(stream: Stream) -> tuple[Output, Output]:
    """Stdout and stderr writing to `stream`, one queue between them so that their order holds."""
    pending: list = []
    return Output(stream.out, pending), Output(stream.err, pending)
