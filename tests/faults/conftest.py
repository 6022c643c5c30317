"""Fixtures for the fault tests: one twin process with its fault proxy on, shared by the folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_harness import SPEC

from emulators.control import TwinControl
from emulators.twin import TwinProcess


@pytest.fixture(scope="session")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(SPEC) as tw:
        yield tw


@pytest.fixture
def ctl(twin: TwinProcess) -> Iterator[TwinControl]:
    """The twin's control API, with the proxy healed and the switch reset before and after each test."""
    control = twin.control
    control.call(None, "proxy.reset")
    control.call("ocs1", "reset")
    yield control
    control.call(None, "proxy.reset")
    control.call("ocs1", "reset")
