"""The device hub (testbed/engine/hub.py): many devices in one process, each on its own thread, each device's
calls in the order the engine sent them, and a device whose driver cannot start failing only its own calls.
In-process here (the hub is an ordinary class); tests/integration runs it as the Ray actor `testbed run` uses.
"""

from __future__ import annotations

import asyncio
import random
import threading

from drivers.transports import TransportSettings
from testbed.engine.hub import DeviceHub, DeviceSpec


class Recorder:
    """Stands in for a DeviceActor's methods: records the calls in the order they ran, and on which thread."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def run(self, n: int, _kwargs: dict) -> int:
        self.calls.append(n)
        self.threads.add(threading.current_thread().name)
        return n


def hub_of(names: list[str]) -> tuple[DeviceHub, dict[str, Recorder]]:
    # Devices with a driver that does not exist: the hub serves them as broken; their lanes get recorders.
    hub = DeviceHub(
        [DeviceSpec(n, "no-such-driver", TransportSettings("visa", "TCPIP0::192.0.2.1::5025::SOCKET")) for n in names]
    )
    recorders = {n: Recorder() for n in names}
    for n in names:
        hub._lanes[n].actor = recorders[n]
    return hub, recorders


def test_each_devices_calls_run_in_the_order_they_were_numbered_whatever_order_they_arrive_in():
    hub, recorders = hub_of(["a", "b"])

    async def main() -> list[int]:
        order = list(range(40))
        random.Random(7).shuffle(order)  # Ray may deliver an async actor's calls in any order
        calls = [hub.call(dev, n, "run", n, {}) for n in order for dev in ("a", "b")]
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert sorted(results) == sorted(list(range(40)) * 2)
    assert recorders["a"].calls == list(range(40)) and recorders["b"].calls == list(range(40))
    # each device on a thread of its own: never the other's
    assert recorders["a"].threads.isdisjoint(recorders["b"].threads)


def test_a_device_whose_driver_cannot_start_fails_its_own_calls_as_data():
    hub = DeviceHub(
        [
            DeviceSpec("ocs9", "no-such-driver", TransportSettings("visa", "TCPIP0::192.0.2.1::5025::SOCKET")),
        ]
    )

    async def main():
        return await hub.call("ocs9", 0, "run", "ocs.identify", {})

    result = asyncio.run(main())
    assert result.status == "fail" and result.device == "ocs9" and result.procedure == "ocs.identify"
    assert "ocs9" in result.error and "no-such-driver" in result.error


def test_a_call_whose_predecessors_never_come_starts_after_the_gap(monkeypatch):
    """Calls numbered before it went to a hub process that died (Ray restarted the hub, numbers go on): it waits
    GAP_S for them, then starts, and the calls after it follow in order.
    """
    import testbed.engine.hub as hub_module

    monkeypatch.setattr(hub_module, "GAP_S", 0.05)
    hub, recorders = hub_of(["a"])
    answers: list[tuple[int, object]] = []
    all_done = threading.Event()

    def done(n):
        def record(result, exc):
            answers.append((n, exc or result))
            if len(answers) == 3:
                all_done.set()

        return record

    for n in (6, 5, 7):  # 0..4 never come
        hub.call_threadsafe("a", n, "run", (n, {}), done(n))
    assert all_done.wait(5)
    assert recorders["a"].calls == [5, 6, 7] and sorted(answers) == [(5, 5), (6, 6), (7, 7)]


def test_direct_calls_need_no_event_loop():
    """A call from a direct channel's reader thread goes to the device's thread and back without the hub's event
    loop (here there is none at all), in its numbered order, with an unknown device or method answered as an
    error rather than lost.
    """
    hub, recorders = hub_of(["a", "b"])
    answers: dict[tuple[str, int], object] = {}
    finished = threading.Semaphore(0)

    def done(key):
        def record(result, exc):
            answers[key] = exc if exc is not None else result
            finished.release()

        return record

    order = list(range(20))
    random.Random(5).shuffle(order)
    for n in order:
        for dev in ("a", "b"):
            hub.call_threadsafe(dev, n, "run", (n, {}), done((dev, n)))
    hub.call_threadsafe("c", 0, "run", (0, {}), done(("c", 0)))
    hub.call_threadsafe("a", 20, "no_such_method", (), done(("a", 20)))
    for _ in range(42):
        assert finished.acquire(timeout=5)
    assert recorders["a"].calls == list(range(20)) and recorders["b"].calls == list(range(20))
    assert isinstance(answers[("c", 0)], KeyError) and isinstance(answers[("a", 20)], AttributeError)
