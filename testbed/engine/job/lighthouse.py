"""TorchFT's lighthouse for a job that trains in TorchFT's loop (`job.torchft`), the controller's side.

One lighthouse per job.start, from before the ranks start until job.stop, started by the controller where every
host of the job reaches it: on the address the job's in-job store listens on (testbed/engine/job/injob.py), in a
process of its own (torchft's LighthouseServer, run by this Python), so that its log stays out of the controller's.
Its port is written into the job's store (key hostside.torchft_train.LIGHTHOUSE_KEY): each replica group, and a
parked spare once it is named, reads it there and reaches the lighthouse at the store's address.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

from testbed.config.sections import JobTorchFT
from testbed.contracts.errors import StepFailed

# What to install when a playbook names torchft (docs/jobs.md, "TorchFT").
TORCHFT_INSTALL = "pip install -e '.[torchft]' (or pip install 'testbed[torchft]': torchft 0.2.0 beside PyTorch)"
# How long the lighthouse process has to say where it listens (a Python start and torchft's import).
START_TIMEOUT_S = 60.0

# Run as `python -c`: the server lives as long as the process, which prints the port it bound and then reads its
# stdin until the controller closes it, or dies: a controller that is killed leaves no lighthouse behind.
SERVE = """
import sys
from torchft.coordination import LighthouseServer
server = LighthouseServer(bind=sys.argv[1], min_replicas=int(sys.argv[2]), join_timeout_ms=int(sys.argv[3]),
                          quorum_tick_ms=int(sys.argv[4]), heartbeat_timeout_ms=int(sys.argv[5]))
print(server.address().rstrip("/").rpartition(":")[2], flush=True)
sys.stdin.read()
"""


def torchft_missing() -> str | None:
    """Why this Python cannot run a TorchFT job (or serve its lighthouse), or None when it can."""
    for module in ("torch", "torchft"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed in {sys.executable}"
    return None


class Lighthouse:
    """torchft's lighthouse in a process of its own, listening on `listen` (any free port)."""

    def __init__(self, listen: str, options: JobTorchFT, ranks: int) -> None:
        missing = torchft_missing()
        if missing is not None:
            raise StepFailed(
                f"job.torchft: the controller serves TorchFT's lighthouse, and {missing}: {TORCHFT_INSTALL}"
            )
        min_replicas = options.min_replicas if options.min_replicas is not None else max(1, ranks - 1)
        bind = f"[{listen}]:0" if ":" in listen else f"{listen}:0"
        self._log = tempfile.NamedTemporaryFile(prefix="testbed-lighthouse-", suffix=".log", delete=False)
        args = [bind, min_replicas, options.join_timeout_ms, options.quorum_tick_ms, options.heartbeat_timeout_ms]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},  # its quorum lines at INFO would be one per step
            start_new_session=True,  # a Ctrl-C of the run reaches the controller, which ends it (close)
        )
        try:
            line = _first_line_within(self._proc.stdout, START_TIMEOUT_S)
            self.port = int(line)
        except (TimeoutError, ValueError):
            why = self._tail()
            self.close()
            raise StepFailed(f"job.torchft: TorchFT's lighthouse did not start on {bind}: {why}") from None

    def _tail(self) -> str:
        """The last line the lighthouse process wrote (its error, when it failed), or "no output"."""
        text = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return text[-1] if text else "no output"

    def close(self) -> None:
        """End the lighthouse process (by its own id) and remove its log."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def _first_line_within(stream: IO[str] | None, timeout_s: float) -> str:
    """A process's first line of output, or TimeoutError if it prints none (or exits) within `timeout_s`."""
    assert stream is not None  # the caller's Popen has stdout=PIPE
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0].strip():
        raise TimeoutError
    return box[0].strip()
