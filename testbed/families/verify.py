"""Verifying a change: the device holds the circuits asked for, and every new output reads light."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from drivers.errors import DeviceError
from testbed.families.context import ProcedureContext

POLL_INTERVAL_S = 0.001  # one power query per ms at most


class VerificationError(DeviceError):
    """The device accepted the change but a check after it failed (read-back or light): the device answered, but
    the lab is not as asked.
    """


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
    naming the dark ports (`what`: "egress port(s)", "output(s) of the chip") after `timeout_s`.
    """
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


def check_holds(
    want: Mapping[int, int],
    holds: Mapping[int, int],
    ctx: ProcedureContext,
    *,
    what: str,
    hint: str,
    sent: str | None = None,
) -> None:
    """Raise VerificationError listing every circuit of `want` that the read-back `holds` lacks."""
    wrong = {i: (e, holds.get(i)) for i, e in want.items() if holds.get(i) != e}
    if wrong:
        detail = ", ".join(f"{i}->{w} (holds {g or 'nothing'})" for i, (w, g) in sorted(wrong.items()))
        raise VerificationError(
            f"{what} does not hold {len(wrong)} circuit(s): {detail}",
            device=ctx.device,
            address=ctx.address,
            sent=sent,
            hint=hint,
        )


def revert_unverified(exc: VerificationError, ctx: ProcedureContext, restore: Callable[[], None]) -> NoReturn:
    """Commit-confirm (as NAPALM's): a change that was not verified is undone by `restore` (mark: reverted),
    and `exc` is raised again saying whether the device is back as it was. The procedure's cached device
    state is dropped either way (procedures.context.forgets_on_error).
    """
    try:
        restore()
    except DeviceError as failed:
        exc.message += f"; reverting the change failed too ({failed.message}): read the device before going on"
        raise exc from failed
    ctx.mark("reverted")
    exc.message += "; the change was reverted (commit-confirm)"
    raise exc
