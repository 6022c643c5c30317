"""Shared by the fault tests: the twin they run against, and polling for real conditions."""

from __future__ import annotations

import time
from collections.abc import Callable

from emulators.spec import OcsSpec, TwinSpec

OCS = OcsSpec("ocs1", size=16, switching_time_ms=5.0, jitter_ms=0.0, seed=7)
SPEC = TwinSpec([OCS], fault_proxy=True)


def wait_until(condition: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll a real condition (not a sleep standing in for one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return bool(condition())
