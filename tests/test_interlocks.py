"""Interlocks next to the driver, and the per-device lock between concurrent runs."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from drivers.errors import InterlockError
from drivers.transports import TransportSettings
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess
from testbed.contracts.errors import UserError
from testbed.engine.locks import device_locks
from testbed.families.drivers import make_driver
from testbed.families.interlocks import GuardedSwitch, Policy


@pytest.fixture(scope="module")
def twin():
    with TwinProcess(TwinSpec([OcsSpec(name="ocs1", size=16, switching_time_ms=1, jitter_ms=0)])) as t:
        yield t


@pytest.fixture
def switch(twin):
    twin.control.call("ocs1", "reset")
    audit = []
    driver = make_driver(
        "polatis-scpi", "ocs1", TransportSettings("visa", twin.endpoints.devices["ocs1"]["visa"]), audit.append
    )
    yield driver, audit
    driver.close()


def sent(audit) -> list[str]:
    return [r.data for r in audit if r.direction == "tx"]


def test_reserved_port_is_refused_before_anything_is_sent(switch):
    driver, audit = switch
    guarded = GuardedSwitch(driver, Policy("ocs1", "addr", reserved_ports=frozenset({16, 32})))
    guarded.connect([(1, 17)])
    guarded.wait_settled()
    assert guarded.connections() == {1: 17}
    before = len(sent(audit))
    with pytest.raises(InterlockError, match=r"\[16\] are reserved"):
        guarded.connect([(2, 18), (16, 20)])
    with pytest.raises(InterlockError, match="disconnect_all"):
        guarded.disconnect_all()
    assert len(sent(audit)) == before  # nothing reached the wire
    assert guarded.connections() == {1: 17}


def test_allowed_ports_and_read_only(switch):
    driver, audit = switch
    guarded = GuardedSwitch(driver, Policy("ocs1", "addr", allowed_ports=frozenset({1, 2, 17, 18})))
    guarded.connect([(2, 18)])
    with pytest.raises(InterlockError, match=r"\[3\]"):
        guarded.set_port_enabled([3], False)
    ro = GuardedSwitch(driver, Policy("ocs1", "addr", read_only=True))
    with pytest.raises(InterlockError, match="read-only"):
        ro.disconnect([(2, 18)])
    assert ro.connections() == {2: 18}  # reading is always allowed


def test_a_device_in_use_by_another_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_LOCK_DIR", str(tmp_path))
    with device_locks({"ocs1": "TCPIP0::10.0.0.5::5025::SOCKET"}, "run-a"):
        with pytest.raises(UserError, match=r"switch \(TCPIP0::10.0.0.5::5025::SOCKET\) is in use.*run run-a"):
            with device_locks({"switch": "TCPIP0::10.0.0.5::5025::SOCKET"}, "run-b"):
                pass
        with device_locks({"other": "TCPIP0::10.0.0.6::5025::SOCKET"}, "run-c"):
            pass  # a different device is free
    with device_locks({"ocs1": "TCPIP0::10.0.0.5::5025::SOCKET"}, "run-d"):
        pass  # released at the end of run-a


def test_a_lock_dies_with_a_killed_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_LOCK_DIR", str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from testbed.engine.locks import device_locks\n"
            "with device_locks({'ocs1': 'addr-1'}, 'held'):\n    print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="in use"):
            with device_locks({"ocs1": "addr-1"}, "mine"):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
    with device_locks({"ocs1": "addr-1"}, "mine"):
        pass
