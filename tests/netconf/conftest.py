"""Fixtures for the NETCONF tests: the twin (its own process, as a run uses it) and switches whose NETCONF front end
runs on an event loop of this process, for front-end options the twin does not take (module revision, base:1.0
only, short time bounds) and for looking at the engine directly. Both are real SSH servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
from nc_helpers import LocalSwitch, ocs_spec

from emulators import spec as spec_mod
from emulators import twin as twin_mod


@pytest.fixture(scope="package")
def twin() -> Iterator[twin_mod.TwinProcess]:
    with twin_mod.TwinProcess(spec_mod.TwinSpec(devices=[ocs_spec()])) as proc:
        yield proc


@pytest.fixture
def twin_ends(twin) -> dict[str, str]:
    """The twin's switch, reset to no circuits, every port enabled."""
    twin.control.call("ocs1", "reset")
    return twin.endpoints.devices["ocs1"]


@pytest.fixture(scope="package")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="netconf-test-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def local_switch(loop) -> Iterator[Callable[..., LocalSwitch]]:
    """local_switch(**front-end options) -> a fresh LocalSwitch, closed after the test."""
    made: list[LocalSwitch] = []

    def make(spec: spec_mod.OcsSpec | None = None, **options) -> LocalSwitch:
        switch = LocalSwitch(loop, spec or ocs_spec(), **options)
        made.append(switch)
        return switch

    yield make
    for switch in made:
        switch.close()
