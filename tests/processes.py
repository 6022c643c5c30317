"""Stopping a command a test started, as a user stops it, without leaving it behind."""

from __future__ import annotations

import signal
import subprocess


def stop_with_ctrl_c(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Ctrl-C (SIGINT), its pipes drained meanwhile (a full pipe would block its last words), and killed if it is
    not gone within `timeout` s, so that no command outlives its test into the next.
    """
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
