"""The device hub (testbed/runner/hub.py): many devices in one process, each on its own thread, each device's
calls in the order the engine sent them, and a device whose driver cannot start failing only its own calls.
In-process here (the hub is an ordinary class); tests/integration runs it as the Ray actor `testbed run` uses."""

from __future__ import annotations

import asyncio
import random
import threading

from drivers.transports import TransportSettings
from testbed.runner.hub import DeviceHub, DeviceSpec


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
