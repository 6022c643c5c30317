"""A job's output carried from its pipe into its log file by the host (GpuHostEngine.spawn), and what makes an
exit visible only once that output is in the file.

On a lab a job writes its log itself (`cmd > log`): by the time its process is a zombie, every line it wrote is
in the file, so a watch that sees the exit and reads the log a last time (drivers/gpuhost/watch.py) has every
line. Here the host copies the output through a pipe, to timestamp each line as it is written (ground truth)
and wake `tail -F` at once; the copy can trail the process's exit, most of all on a busy machine. So the host
reaps a job only once the copy has caught up with everything the job wrote (`LogCopier.drain`), and until then
shows its tools the process as still sleeping in its last write (host.job_state, host.job_stat) instead of a
zombie.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import IO

CHUNK = 65536


class LogCopier:
    """Copies one job's output pipe into its log file until the pipe closes; `on_chunk(data, t_ns)` is told of
    each chunk once it is in the file (t_ns: when it was read from the pipe).
    """

    def __init__(self, pipe: IO[bytes], sink: int, on_chunk: Callable[[bytes, int], None], name: str) -> None:
        self._pipe, self._sink, self._on_chunk = pipe, sink, on_chunk
        self._changed = threading.Condition()
        self._copied = 0  # bytes written into the file so far
        self._ended = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait until the pipe has closed (every process holding it has ended) and the copy is done."""
        self._thread.join()

    def drain(self) -> None:
        """Wait until every byte in the pipe now is in the file. Called once the job's process has exited, that
        is all it wrote (a child still holding the pipe may add more; what it writes later is not waited for).
        """
        with self._changed:
            if self._ended:
                return
            target = self._copied + _unread(self._pipe.fileno())
            self._changed.wait_for(lambda: self._ended or self._copied >= target)

    def _run(self) -> None:
        fd = self._pipe.fileno()
        ready = select.poll()
        ready.register(fd, select.POLLIN)
        try:
            while True:
                ready.poll()  # data or the end of the pipe: the read below then does not block
                with self._changed:  # a drain's count of what is unread sees no chunk half copied
                    chunk = os.read(fd, CHUNK)
                    if not chunk:
                        return
                    t_ns = time.monotonic_ns()
                    os.write(self._sink, chunk)
                    self._copied += len(chunk)
                    self._changed.notify_all()
                self._on_chunk(chunk, t_ns)
        except OSError:
            pass  # the file's disk went away with the host's home (reset): the job's output is lost
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()
            os.close(self._sink)
            self._pipe.close()


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
