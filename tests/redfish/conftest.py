"""One twin for the folder: two emulated GPU hosts, each with its BMC (Redfish over HTTPS) and its SSH server,
in a twin process of its own as a run starts it. Each test finds both hosts powered on, with no jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bmc_twin import HOSTS

from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess


@pytest.fixture(scope="session")
def twin() -> Iterator[TwinProcess]:
    spec = TwinSpec(devices=[GpuHostSpec(h, gpus=2, seed=3, jobs=("sleep",)) for h in HOSTS])
    with TwinProcess(spec) as tw:
        yield tw


@pytest.fixture
def ctl(twin: TwinProcess):
    """The twin's control, every host reset (powered on, no jobs) before and after the test."""
    control = twin.control
    for h in HOSTS:
        control.call(h, "reset")
    yield control
    for h in HOSTS:
        control.call(h, "reset")
