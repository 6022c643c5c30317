"""The circuit-switch conformance suite: the built-in Polatis driver on the twin passes it, and a driver
that lets a raw exception escape fails it, naming the check and what to change.
"""

from __future__ import annotations

import operator

import pytest
from conftest import RACK

from drivers.scpi.polatis import PolatisScpi
from drivers.transports import TransportSettings, open_transport
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess
from testbed.conformance import CIRCUIT_SWITCH_CHECKS, FAILED, PASSED, check_circuit_switch

SIZE = 16


class SloppyPolatis(PolatisScpi):
    """Checks ports itself before sending, but with a raw ValueError instead of a DeviceError."""

    def connect(self, pairs, *, check=True):
        pairs = list(pairs)
        for _a, b in pairs:
            if not 1 <= operator.index(b) <= 2 * SIZE:
                raise ValueError(f"port {b} out of range")
        super().connect(pairs, check=check)


@pytest.fixture(scope="module")
def twin():
    spec = TwinSpec(devices=[OcsSpec(name="sw", size=SIZE, jitter_ms=0, input_power_dbm={3: 0.0})])
    with TwinProcess(spec) as proc:
        yield proc


@pytest.fixture
def make(twin):
    drivers = []

    def make_driver(cls=PolatisScpi):
        twin.control.call("sw", "reset")
        settings = TransportSettings("visa", twin.endpoints.devices["sw"]["visa"], timeout_s=0.5)
        drivers.append(cls(open_transport(settings, "sw"), "sw"))
        return drivers[-1]

    yield make_driver
    for d in drivers:
        d.close()


def test_the_builtin_polatis_driver_passes_every_check(make):
    results = check_circuit_switch(make(), size=SIZE, lit_ingress=[3])
    assert [r.check for r in results] == list(CIRCUIT_SWITCH_CHECKS)
    assert [r for r in results if r.status != PASSED] == []
    light = next(r for r in results if r.check == "light")
    assert light.detail == "egress 17: -1.0 dBm"  # ingress 3's 0 dBm minus the 1 dB insertion loss


def test_a_raw_exception_fails_the_check_with_a_clear_message(make):
    results = {r.check: r for r in check_circuit_switch(make(SloppyPolatis), size=SIZE, lit_ingress=[3])}
    failed = {name for name, r in results.items() if r.status == FAILED}
    assert failed == {"out_of_range_connect", "out_of_range_deferred"}
    detail = results["out_of_range_connect"].detail
    assert "connect([(3, 33)]) raised ValueError (port 33 out of range)" in detail
    assert "not a drivers.errors.DeviceError subclass" in detail
    assert "DeviceCommandError" in detail  # what to raise instead


def test_without_a_lit_ingress_the_optical_check_is_skipped_not_passed(make):
    results = {r.check: r for r in check_circuit_switch(make(), size=SIZE, checks=["light", "size"])}
    assert list(results) == ["light", "size"]
    assert results["light"].status == "skipped" and "lit_ingress" in results["light"].detail
    assert results["size"].status == PASSED


def test_a_wrong_size_is_reported_with_both_values(make):
    (result,) = check_circuit_switch(make(), size=(SIZE, 8), checks=["size"])
    assert result.status == FAILED
    assert result.detail == f"size(): expected ({SIZE}, 8), got ({SIZE}, {SIZE})"


SUITE = """
import operator
import pytest
from drivers.scpi.polatis import PolatisScpi
from testbed.conformance import circuit_switch_suite

class SloppyPolatis(PolatisScpi):
    def connect(self, pairs, *, check=True):
        pairs = list(pairs)
        for a, b in pairs:
            if not 1 <= operator.index(b) <= 64:
                raise ValueError(f"port {b} out of range")
        super().connect(pairs, check=check)

@pytest.fixture
def switch(testbed_driver):
    return testbed_driver("ocs1")

@pytest.fixture
def sloppy(testbed_driver):
    real = testbed_driver("ocs1")
    return SloppyPolatis(real.transport, "ocs1")

test_polatis = circuit_switch_suite("switch", size=32, lit_ingress=[1])
test_sloppy = circuit_switch_suite("sloppy", size=32, lit_ingress=[1], checks=["identify", "out_of_range_connect"])
"""


def test_a_plugin_author_runs_the_suite_as_pytest_tests(pytester, run_user_tests):
    pytester.makepyfile(test_my_driver=SUITE)
    result = run_user_tests(f"--testbed-inventory={RACK}")
    result.assert_outcomes(passed=len(CIRCUIT_SWITCH_CHECKS) + 1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_sloppy[[]out_of_range_connect[]] _*",
            "circuit-switch conformance, check 'out_of_range_connect':",
            "connect([[](1, 65)]) raised ValueError (port 65 out of range), which is not a drivers.errors.DeviceError*",
        ]
    )


def test_several_driver_factories_become_parameters(pytester, run_user_tests):
    pytester.makepyfile(
        test_ids="""
from testbed.conformance import circuit_switch_suite
test_switch = circuit_switch_suite({"tcp": object, "serial": object}, size=8, checks=["identify", "size"])
"""
    )
    result = run_user_tests("--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "test_ids.py::test_switch[[]tcp-identify[]]",
            "test_ids.py::test_switch[[]tcp-size[]]",
            "test_ids.py::test_switch[[]serial-identify[]]",
            "test_ids.py::test_switch[[]serial-size[]]",
        ]
    )
