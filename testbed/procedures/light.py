"""Waiting for light: a change is verified when every new output reads power above a threshold."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from testbed.procedures.context import ProcedureContext
from testbed.procedures.errors import VerificationError

POLL_INTERVAL_S = 0.001  # one power query per ms at most


def wait_for_light(
    read_power: Callable[[Sequence[int]], dict[int, float]],
    ctx: ProcedureContext,
    ports: list[int],
    min_power_dbm: float,
    timeout_s: float,
    *,
    what: str,
    hint: str,
    sent: str | None = None,
) -> dict[int, float]:
    """Poll `read_power(ports)` until every port reads at least `min_power_dbm`; raise VerificationError
    naming the dark ports (`what`: "egress port(s)", "output(s) of the chip") after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        powers = read_power(ports)
        dark = [p for p in ports if powers[p] < min_power_dbm]
        if not dark:
            return powers
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{p}: {powers[p]:.2f} dBm" for p in dark[:8])
            raise VerificationError(
                f"no light on {len(dark)} {what} within {timeout_s:g} s (threshold {min_power_dbm} dBm): {shown}",
                device=ctx.device,
                address=ctx.address,
                sent=sent,
                hint=hint,
            )
        time.sleep(POLL_INTERVAL_S)
