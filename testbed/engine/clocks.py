"""Each node's wall-clock offset to the coordinator, measured through the device actors (Cristian's
method: the sample with the shortest round trip bounds the error by half that round trip).

Devices served by one hub share its process, so its node's clock: one measurement per hub (a 256-host hub
is measured once, not 256 times), the hubs measured concurrently.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

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
