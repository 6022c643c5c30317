"""Each node's wall-clock offset to the coordinator, measured through the device actors (Cristian's
method: the sample with the shortest round trip bounds the error by half that round trip)."""

from __future__ import annotations

import time

SAMPLES = 5


def measure_clocks(dispatcher, devices: list[str]) -> dict:
    """Per device: its Ray node, and that node's clock offset to this process (remote - local)."""
    out: dict[str, dict] = {}
    for device in devices:
        best = None
        for _ in range(SAMPLES):
            t0 = time.time()
            where = dispatcher.call(device, "where").result()
            t1 = time.time()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, where["wall"] - (t0 + t1) / 2, where)
        rtt, offset, where = best
        out[device] = {
            "node_id": where["node_id"],
            "hostname": where["hostname"],
            "address": where["address"],
            "clock_offset_ms": round(offset * 1000, 3),
            "offset_error_bound_ms": round(rtt * 500, 3),
        }
    return out
