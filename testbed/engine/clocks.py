"""Each node's wall-clock offset to the coordinator, measured through the device actors (Cristian's
method: the sample with the shortest round trip bounds the error by half that round trip).

Devices served by one hub share its process, so its node's clock: one measurement per hub (a 256-host hub
is measured once, not 256 times), the hubs measured concurrently. A warm session's runs on the same devices reuse
the last measurement while it is fresh and the same actor processes serve (ClocksKept); run.json says which.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

SAMPLES = 5


def measure_clocks(dispatcher, devices: list[str]) -> dict:
    """Per device: its Ray node, and that node's clock offset to this process (remote - local)."""
    hubs = getattr(dispatcher, "hubs", None)
    by_server: dict[int, list[str]] = {}
    for device in devices:
        server = id(hubs[device]) if hubs is not None else id(device)  # in-process actors: each its own
        by_server.setdefault(server, []).append(device)
    groups = list(by_server.values())
    with ThreadPoolExecutor(max_workers=min(16, len(groups)) or 1) as pool:
        measured = list(pool.map(lambda group: _measure(dispatcher, group[0]), groups))
    return {device: clock for group, clock in zip(groups, measured, strict=True) for device in group}


def _measure(dispatcher, device: str) -> dict:
    best: tuple[float, float, dict] | None = None
    for _ in range(SAMPLES):
        t0 = time.time()
        where = dispatcher.call(device, "where").result()
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, where["wall"] - (t0 + t1) / 2, where)
    assert best is not None  # SAMPLES > 0: the loop ran
    rtt, offset, where = best
    return {
        "node_id": where["node_id"],
        "hostname": where["hostname"],
        "address": where["address"],
        "clock_offset_ms": round(offset * 1000, 3),
        "offset_error_bound_ms": round(rtt * 500, 3),
    }


# How long a warm session's measured clocks are used again: the back-to-back runs of a queue reuse them; a run after
# a pause measures anew, since NTP may have slewed a node's clock meanwhile.
KEPT_FOR_S = 60.0


@dataclass
class MeasuredClocks:
    """A measure_clocks result kept with the devices it was made on: when, by which run, and each actor's worker pid
    then (a hub restarted since is another process, perhaps on another node: the clocks are measured again).
    """

    placement: dict
    measured_utc: str
    measured_in: str  # the run that measured them
    monotonic: float
    dispatcher: object  # the devices' dispatcher they were measured through: other devices are measured anew
    pids: dict[str, int] = field(default_factory=dict)

    def record(self, run_id: str) -> dict:
        """What run.json says of them (`placement_clocks`): measured by this run, or reused, and when."""
        reused = run_id != self.measured_in
        return {"measured_utc": self.measured_utc, "measured_in": self.measured_in, "reused": reused}


class ClocksKept:
    """The clocks of a warm session's devices (testbed.Lab keeps one): measured by the first run on them, reused by
    the next ones on the same dispatcher while fresh and while the same actor processes serve (the run checks
    their pids after its first command: `still_true`).
    """

    def __init__(self) -> None:
        self.kept: MeasuredClocks | None = None

    def for_run(self, dispatcher, devices: list[str], run_id: str) -> MeasuredClocks:
        kept = self.kept
        if (
            kept is not None
            and kept.pids  # the run that measured them saw its actors' pids: the next can tell a restart
            and kept.dispatcher is dispatcher
            and set(devices) <= set(kept.placement)
            and time.monotonic() - kept.monotonic < KEPT_FOR_S
        ):
            return kept
        return self.measure(dispatcher, devices, run_id)

    def measure(self, dispatcher, devices: list[str], run_id: str) -> MeasuredClocks:
        placement = measure_clocks(dispatcher, devices)
        utc = datetime.now(UTC).isoformat()
        self.kept = MeasuredClocks(placement, utc, run_id, time.monotonic(), dispatcher)
        return self.kept

    def still_true(self, clocks: MeasuredClocks, pids: dict[str, int], dispatcher, run_id: str) -> MeasuredClocks:
        """`clocks` if every actor is the process they were measured on, else measured again now. `pids`: each
        actor's worker pid after the run's first command (kept with clocks this run measured).
        """
        if clocks.measured_in == run_id:
            clocks.pids = dict(pids)
            return clocks
        if clocks.pids != pids:
            fresh = self.measure(dispatcher, list(clocks.placement), run_id)
            fresh.pids = dict(pids)
            return fresh
        return clocks
