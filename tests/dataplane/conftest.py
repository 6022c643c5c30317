"""Fixtures for the data-plane tests: one twin process (dataplane_harness.SPEC) shared by the folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dataplane_harness import SPEC, Rank
from raw_scpi import ask

from emulators.control import TwinControl
from emulators.twin import TwinProcess


@pytest.fixture(scope="session")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(SPEC) as tw:
        yield tw


@pytest.fixture
def ctl(twin: TwinProcess) -> Iterator[TwinControl]:
    """The control API, with the switches and the data plane reset before and after each test."""
    control = twin.control

    def reset() -> None:
        control.call(None, "dataplane.reset")
        control.call("ocs1", "reset")
        control.call("ocs2", "reset")

    reset()
    yield control
    reset()


@pytest.fixture
def scpi(twin: TwinProcess):
    """scpi(device, *lines) -> the answers to the query lines, on a fresh connection to the device."""

    def run(device: str, *lines: str) -> list[str]:
        return ask(twin.endpoints.devices[device]["tcp"], *lines)

    return run


@pytest.fixture
def rank() -> Iterator[Rank]:
    r = Rank()
    yield r
    r.close()
