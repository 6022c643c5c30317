"""Shared by the fault tests: the twin they run against, and polling for real conditions."""

from __future__ import annotations

import sys
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


# --- shared by the driver x fault matrices of the other drivers (test_fault_matrix_*.py) -----------------

# The proxy's fault kinds, as in test_fault_matrix.py, with the delays scaled to a transport timeout.
PROXY_FAULTS = [
    "latency_above",
    "latency_below",
    "bandwidth",
    "slow_close",
    "timeout",
    "reset_peer",
    "slicer",
    "limit_data",
    "down",
]


def proxy_toxic(fault: str, timeout_s: float) -> tuple[str, str, dict] | None:
    """(toxic type, stream, attributes) for `fault`, or None for "down" (the proxy disabled)."""
    ms = timeout_s * 1000
    return {
        "latency_above": ("latency", "downstream", {"latency": ms * 3}),  # every reply late by 3 timeouts
        "latency_below": ("latency", "downstream", {"latency": ms / 4}),  # late, within the timeout
        # 2 KB/s, in 100 ms pieces: slow, yet the health probe's one reply (nvidia-smi and dmesg, ~1 KB with
        # SSH framing) still fits in the 1 s timeout
        "bandwidth": ("bandwidth", "downstream", {"rate": 2.0}),
        "slow_close": ("slow_close", "downstream", {"delay": 2000}),  # a close from the device, 2 s late
        "timeout": ("timeout", "downstream", {"timeout": 0}),  # replies swallowed, connection held: a stall
        "reset_peer": ("reset_peer", "downstream", {"timeout": 0}),  # TCP RST when the first reply comes
        "slicer": ("slicer", "downstream", {"average_size": 3, "size_variation": 1, "delay": 2000}),
        "limit_data": ("limit_data", "downstream", {"bytes": 4}),  # 4 bytes of reply, then the proxy closes
        "down": None,  # open connections closed (FIN), new ones refused
    }[fault]


def inject_proxy_fault(control, device: str, fault: str, timeout_s: float) -> None:
    toxic = proxy_toxic(fault, timeout_s)
    if toxic is None:
        control.call(device, "proxy.set_enabled", enabled=False)
        return
    kind, stream, attributes = toxic
    control.call(device, "proxy.add_toxic", name=fault, type=kind, stream=stream, attributes=attributes)


def make_actor(device: str, driver: str, settings):
    """The runner's DeviceActor, used in-process (no Ray): it records each call as ok, fail or info."""
    from testbed.engine.device_actor import DeviceActor

    interval = sys.getswitchinterval()
    try:
        return DeviceActor(device, driver, settings)
    finally:
        sys.setswitchinterval(interval)  # the actor tunes the interpreter for a Ray worker, not for pytest


TYPED = {"DeviceTimeout", "DeviceConnectionError", "DeviceProtocolError", "DeviceCommandError"}


def names_timeout(message: str, timeout_s: float) -> bool:
    """Whether a timeout's message says which timeout ran out ("within 400 ms", "within 1 s"): a call that ends
    in one is bounded by it, which is what "never a hang" means, and the user learns what to raise.
    """
    return f"within {timeout_s * 1000:.0f} ms" in message or f"within {timeout_s:g} s" in message
