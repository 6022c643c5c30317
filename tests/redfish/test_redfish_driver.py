"""The BMC driver (drivers/redfish/bmc.py) against the twin's emulated BMC: what a lab relies on when it powers a
host off and on through Redfish. Powering off really takes the host down (its job's processes die, its SSH
port refuses); powering on brings SSH back; PowerState is read back each time; every exchange is audited,
the password never.
"""

from __future__ import annotations

import os
import socket

import pytest
from bmc_twin import bmc_settings, endpoints, ssh_settings

from drivers.errors import DeviceCommandError
from drivers.redfish import RedfishBmc
from emulators.frontends import TWIN_PASSWORD
from testbed.families.drivers import make_driver


def ssh_refuses(ep: dict) -> bool:
    address, _, port = ep["ssh"].rpartition(":")
    try:
        socket.create_connection((address, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_power_off_takes_the_host_down_and_power_on_brings_ssh_back(twin, ctl):
    ep = endpoints(twin)
    ssh = make_driver("ssh", "gpu01", ssh_settings(ep))
    try:
        job = ssh.run_job(["sleep", "60"], name="rank0.0", gpus=[0])
        assert os.path.exists(f"/proc/{job.pid}")  # the twin's host runs it as a real process
        audit = []
        with RedfishBmc(bmc_settings(ep), "gpu01", audit.append) as bmc:
            assert bmc.power_state() == "On"
            off = bmc.power_off()
            assert off["changed"] and off["power_state"] == "Off" and bmc.power_state() == "Off"
            # The reset's midpoint lies inside the reset request, as the fault kind's injection time.
            post = [r for r in audit if r.data.startswith("POST") and "Reset" in r.data][-1]
            answer = audit[audit.index(post) + 1]
            assert post.mono_ns <= off["reset_ns"] <= answer.mono_ns
            assert ssh_refuses(ep)
            assert not os.path.exists(f"/proc/{job.pid}")
            assert ctl.call("gpu01", "state")["powered"] is False

            on = bmc.power_on()
            assert on["changed"] and on["power_state"] == "On"
            assert ssh.exec("hostname").stdout.strip()  # the driver reconnects to the host's SSH again
            assert not ssh_refuses(ep)
            # A power call on a host already in that state sends no reset (several BMCs refuse one with 409).
            again = bmc.power_on()
            assert again == {**again, "changed": False, "reset": None, "power_state": "On"}
        text = "\n".join(r.data for r in audit)
        assert 'POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset {"ResetType": "ForceOff"}' in text
        assert 'ComputerSystem.Reset {"ResetType": "On"}' in text
        assert TWIN_PASSWORD not in text.replace("testbed twin", "")  # the login is recorded without it
        assert "(log out)" in text  # the session slot is freed
        assert {r.address for r in audit} == {ep["redfish"]}
    finally:
        ssh.close()


def test_the_other_hosts_bmc_powers_only_that_host(twin, ctl):
    with RedfishBmc(bmc_settings(endpoints(twin, "gpu02")), "gpu02") as bmc:
        bmc.power_off()
    assert ctl.call("gpu02", "state")["powered"] is False
    assert ctl.call("gpu01", "state")["powered"] is True
    assert ssh_refuses(endpoints(twin, "gpu02")) and not ssh_refuses(endpoints(twin, "gpu01"))


def test_a_system_named_in_the_inventory_is_used_and_an_unknown_one_is_refused(twin, ctl):
    ep = endpoints(twin)
    with RedfishBmc(bmc_settings(ep, system="1"), "gpu01") as bmc:
        assert bmc.power_state() == "On"
    with RedfishBmc(bmc_settings(ep, system="2"), "gpu01") as bmc, pytest.raises(DeviceCommandError) as err:
        bmc.power_off()
    assert "no system '2'" in str(err.value) and "bmc.system to one of: 1" in str(err.value)
    assert ctl.call("gpu01", "state")["powered"] is True  # nothing was reset


def test_twin_control_power_off_shows_in_the_bmcs_power_state(twin, ctl):
    """The BMC reports the host's power whoever changed it: the twin's own power_off op (a timed fault)."""
    ctl.call("gpu01", "power_off")
    with RedfishBmc(bmc_settings(endpoints(twin)), "gpu01") as bmc:
        assert bmc.power_state() == "Off"
        assert bmc.power_on()["changed"]
    assert ctl.call("gpu01", "state")["powered"] is True
