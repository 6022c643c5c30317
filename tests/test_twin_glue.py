"""Pointing an inventory at the twin, and refusing to go on if anything would still leave the machine."""

from __future__ import annotations

import pytest

from testbed.contracts.errors import UserError
from testbed.documents import load_inventory
from testbed.twin.bridge import assert_loopback, point_at_twin, twin_spec


@pytest.fixture(scope="module")
def inventory(repo):
    return load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model


def test_spec_lights_the_ingress_ports_that_hosts_are_cabled_to(inventory):
    ocs = next(d for d in twin_spec(inventory, seed=3).devices if d.name == "ocs1")
    assert ocs.size == 32 and ocs.switching_time_ms == 25
    assert sorted(ocs.input_power_dbm) == list(range(1, 21))  # 10 hosts x 2 ports
    assert 21 not in ocs.input_power_dbm


def test_point_at_twin_replaces_the_lab_address(inventory):
    endpoints = {
        "devices": {
            "ocs1": {
                "kind": "ocs",
                "visa": "TCPIP0::127.0.0.1::4000::SOCKET",
                "serial": "/dev/pts/9",
                "tcp": "127.0.0.1:4000",
            }
        }
    }
    twin_inv = point_at_twin(inventory, endpoints)
    assert twin_inv.devices["ocs1"].transport.resource == "TCPIP0::127.0.0.1::4000::SOCKET"
    assert inventory.devices["ocs1"].transport.resource.startswith("TCPIP0::192.0.2.10")  # original untouched
    assert_loopback(twin_inv, ["ocs1"])


def test_a_device_left_on_a_lab_address_is_refused(inventory):
    with pytest.raises(UserError, match="ocs1 -> TCPIP0::192.0.2.10::5025::SOCKET"):
        assert_loopback(inventory, ["ocs1"])
