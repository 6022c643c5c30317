"""link.down in the twin's data plane: the Polatis SCPI driver, over TCP, disables a host fibre's two switch
ports; the circuits through them read dark and the relays between the hosts stop carrying bytes (open
connections are reset, new ones refused); enabling the ports carries bytes again.
"""

from __future__ import annotations

import socket

import pytest
from dataplane_harness import recv_exact, refused, wait_reset

from drivers.scpi.polatis import PolatisScpi
from drivers.transports import TransportSettings, open_transport

A_TO_B, B_TO_A = (1, 10), (2, 9)  # gpu01:p0 -> gpu02:p0 and back, on ocs1
GPU01_P0 = [1, 9]  # the ingress gpu01:p0 transmits into, the egress it receives from


@pytest.fixture
def ocs1(twin):
    host, port = twin.endpoints.devices["ocs1"]["tcp"].rsplit(":", 1)
    settings = TransportSettings("visa", f"TCPIP0::{host}::{port}::SOCKET", 5.0, read_termination="\n")
    driver = PolatisScpi(open_transport(settings, "ocs1"), "ocs1")
    yield driver
    driver.close()


def relay(ctl, target_port: int) -> str:
    return ctl.call(
        None,
        "dataplane.link",
        src_host="gpu01",
        src_port="p0",
        dst_host="gpu02",
        dst_port="p0",
        target_port=target_port,
    )


def carries(relay_address: str, rank) -> bool:
    """A new connection through the relay carries bytes both ways."""
    host, _, port = relay_address.rpartition(":")
    client = socket.create_connection((host, int(port)), timeout=5)
    server = rank.accept()
    with client, server:
        client.sendall(b"grad" * 100)
        server.sendall(b"ack")
        return recv_exact(server, 400) == b"grad" * 100 and recv_exact(client, 3) == b"ack"


def test_disabled_ports_darken_the_circuits_and_stop_the_data_plane(ctl, ocs1, rank):
    address = relay(ctl, rank.port)
    ocs1.connect([A_TO_B, B_TO_A])
    ocs1.wait_settled()
    assert carries(address, rank)
    lit = ocs1.port_power([9, 10])
    assert all(dbm > -20 for dbm in lit.values()), lit

    host, _, port = address.rpartition(":")
    client = socket.create_connection((host, int(port)), timeout=5)
    server = rank.accept()
    with client, server:
        client.sendall(b"x")
        assert recv_exact(server, 1) == b"x"
        ocs1.set_port_enabled(GPU01_P0, False)
        wait_reset(client)  # the open connection is cut (RST), not left hanging: it raises if nothing comes
    assert ocs1.port_states([1, 2, 9, 10]) == {1: "D", 2: "E", 9: "D", 10: "E"}
    assert ocs1.port_power([9, 10]) == {9: -99.99, 10: -99.99}
    assert ocs1.connections() == dict([A_TO_B, B_TO_A])  # the circuits stay
    assert refused(address)
    state = next(r for r in ctl.call(None, "dataplane.state")["relays"] if r["address"] == address)
    assert state["lit"] is False and "ocs1 port 1 is disabled" in state["forward"]["why"]
    cut = [e for e in ctl.call(None, "dataplane.state")["events"] if e["event"] == "cut"]
    assert len(cut) == 1 and "port 1 is disabled" in cut[0]["why"], cut  # cut for the disabled port, by the plane
    assert "ocs1 port 9 is disabled" in state["backward"]["why"]

    ocs1.set_port_enabled(GPU01_P0, True)
    assert ocs1.port_states(GPU01_P0) == {1: "E", 9: "E"}
    assert ocs1.port_power([9, 10]) == lit
    assert carries(address, rank)


def test_one_disabled_end_is_enough_to_stop_both_directions(ctl, ocs1, rank):
    """TCP needs both directions: a disabled egress alone (gpu01's receiver) breaks the connection."""
    address = relay(ctl, rank.port)
    ocs1.connect([A_TO_B, B_TO_A])
    ocs1.wait_settled()
    ocs1.set_port_enabled([9], False)
    assert refused(address)
    power = ocs1.port_power([9, 10])
    assert power[9] == -99.99 and power[10] > -20  # gpu01 -> gpu02 is still lit, the way back is dark
    ocs1.set_port_enabled([9], True)
    assert carries(address, rank)
