"""A photonic_mesh twin adapter served on a private event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from emulators.devices import build_device
from emulators.endpoints import precise_event_loop
from emulators.mesh.spec import MeshSpec


class LoopThread:
    def __init__(self):
        self.loop = precise_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def call(self, fn, *args, **kwargs):
        """Run fn on the loop thread (the chip's state belongs to it)."""

        async def wrapper():
            return fn(*args, **kwargs)

        return self.run(wrapper())

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def mesh_device():
    """Factory: start an emulated chip; returns (device, endpoints, loop thread)."""
    started = []

    def start(size: int = 8, seed: int = 7, **kw):
        spec = MeshSpec(name="chip1", size=size, seed=seed, input_power_dbm={p: 0.0 for p in range(1, size + 1)}, **kw)
        lt = LoopThread()
        dev = build_device(spec)

        async def go():
            return await dev.start(asyncio.get_running_loop())

        endpoints = lt.run(go())
        started.append((lt, dev))
        return dev, endpoints, lt

    yield start
    for lt, dev in started:
        lt.run(dev.close())
        lt.stop()
