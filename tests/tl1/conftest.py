"""Fixtures for the TL1 tests: one twin for the whole folder (a switch per dialect), and drivers on it."""

from __future__ import annotations

import pytest
from tl1_harness import MAKERS, settings_for, twin_spec

from emulators.twin import TwinProcess


@pytest.fixture(scope="session")
def tl1_twin():
    with TwinProcess(twin_spec()) as proc:
        yield proc


@pytest.fixture
def make_driver(tl1_twin):
    """make_driver(device, **settings) -> a driver on the twin's switch `device`, reset first; closed after."""
    made = []

    def make(device: str, *, audit=None, reset: bool = True, **kw):
        if reset:
            tl1_twin.control.call(device, "reset")
        driver = MAKERS[device](device, settings_for(tl1_twin.endpoints.devices[device]["tl1"], **kw), audit)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()
