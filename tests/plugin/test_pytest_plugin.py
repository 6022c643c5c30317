"""The pytest plugin as a user meets it: fixtures that boot the twin of an inventory and hand out the real
drivers on it, run in a user's own test suite (pytester).
"""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import RACK, SMALL_INVENTORY

USER_TESTS = """
def test_connect_two_ports_and_read_light(testbed_driver):
    ocs = testbed_driver("ocs1")
    ocs.connect([(1, 33)])              # gpu01:p0's transmitter -> gpu01:p0's receiver
    ocs.wait_settled()
    assert ocs.connections() == {1: 33}
    assert ocs.port_power([33])[33] > -20
    sent = [r.data for r in testbed_driver.records("ocs1", "tx")]
    assert any(s.startswith(":OXC:SWIT:CONN:ADD (@1),(@33)") for s in sent)
    assert testbed_driver.records("ocs1", "rx")

def test_each_test_gets_the_device_reset(testbed_driver):
    assert testbed_driver("ocs1").connections() == {}

def test_the_lab_points_at_the_twin_only(testbed_inventory, testbed_lab, testbed_twin):
    assert testbed_inventory.devices["ocs1"].transport.resource == "TCPIP0::192.0.2.10::5025::SOCKET"
    assert testbed_lab.devices["ocs1"].transport.resource == testbed_twin.endpoints.devices["ocs1"]["visa"]
    assert testbed_lab.devices["gpu01"].transport.host == "127.0.0.1"
    assert testbed_twin.control.call("ocs1", "state")["size"] == 32
"""


def test_a_user_test_drives_the_real_driver_on_the_twin(pytester, run_user_tests):
    pytester.makepyfile(test_user=USER_TESTS)
    result = run_user_tests(f"--testbed-inventory={RACK}")
    result.assert_outcomes(passed=3)


def test_one_twin_per_session_stopped_at_the_end(pytester, run_user_tests):
    record = """
def test_pid(testbed_twin, tmp_path_factory):
    with open({path!r}, "a") as f:
        f.write(f"{{testbed_twin.process.pid}}\\n")
"""
    pids = pytester.path / "pids.txt"
    pytester.makepyfile(test_a=record.format(path=str(pids)), test_b=record.format(path=str(pids)))
    run_user_tests(f"--testbed-inventory={RACK}").assert_outcomes(passed=2)
    first, second = pids.read_text().split()
    assert first == second  # both modules got the same twin
    with pytest.raises(ProcessLookupError):
        os.kill(int(first), 0)  # and it is gone (reaped) once the session ended


def test_default_inventory_is_the_emulated_rack_under_the_rootdir(pytester, run_user_tests):
    (pytester.path / "playbooks" / "inventory").mkdir(parents=True)
    shutil.copy(RACK, pytester.path / "playbooks" / "inventory" / "emulated-rack.yaml")
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_user=USER_TESTS)
    run_user_tests().assert_outcomes(passed=3)


def test_ini_option_and_per_module_marker(pytester, run_user_tests):
    (pytester.path / "labs").mkdir()
    (pytester.path / "labs" / "small.yaml").write_text(SMALL_INVENTORY)
    shutil.copy(RACK, pytester.path / "rack.yaml")
    pytester.makeini("[pytest]\ntestbed_inventory = rack.yaml\n")
    pytester.makepyfile(
        test_rack="""
def test_rack(testbed_driver):
    assert testbed_driver("ocs1").size() == (32, 32)
""",
        test_small="""
import pytest
pytestmark = pytest.mark.testbed_inventory("labs/small.yaml")

def test_small(testbed_driver, testbed_inventory):
    assert list(testbed_inventory.devices) == ["sw"]
    assert testbed_driver("sw").size() == (8, 8)
""",
    )
    run_user_tests().assert_outcomes(passed=2)


def test_a_missing_inventory_says_how_to_give_one(pytester, run_user_tests):
    pytester.makepyfile(test_user="def test_x(testbed_driver):\n    pass\n")
    result = run_user_tests("--testbed-inventory=nowhere.yaml")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*inventory*nowhere.yaml not found*--testbed-inventory*"])


def test_unknown_device_and_misplaced_marker_are_refused_clearly(pytester, run_user_tests):
    pytester.makepyfile(
        test_user="""
import pytest

def test_unknown(testbed_driver):
    testbed_driver("ocs9")

@pytest.mark.testbed_inventory("other.yaml")
def test_marked(testbed_driver):
    pass
"""
    )
    result = run_user_tests(f"--testbed-inventory={RACK}")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["*no device 'ocs9' in the inventory (devices: ocs1, chip1, gpu01*"])
    result.stdout.fnmatch_lines(["*testbed_inventory applies per module*pytestmark*"])


def test_a_failing_test_shows_what_was_exchanged_with_the_device(pytester, run_user_tests):
    pytester.makepyfile(
        test_user="""
def test_wrong_expectation(testbed_driver):
    ocs = testbed_driver("ocs1")
    assert ocs.identify().vendor == "Calient"
"""
    )
    result = run_user_tests(f"--testbed-inventory={RACK}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*testbed audit*", "ocs1 tx '[*]IDN?\\n'", "ocs1 rx 'Polatis,*"])
