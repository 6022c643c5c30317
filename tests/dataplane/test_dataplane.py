"""The twin's data plane: relays between host ports pass bytes only along lit light paths, both ways."""

from __future__ import annotations

import socket
import time

import pytest
from dataplane_harness import SPEC, address, recv_exact, refused, wait_reset

from emulators.control import TwinControlError
from emulators.spec import TwinSpec

A_TO_B = "(@1),(@10)"  # gpu01:p0 transmits -> gpu02:p0 receives
B_TO_A = "(@2),(@9)"  # gpu02:p0 transmits -> gpu01:p0 receives


def link(ctl, target_port: int, src=("gpu01", "p0"), dst=("gpu02", "p0")) -> str:
    return ctl.call(
        None,
        "dataplane.link",
        src_host=src[0],
        src_port=src[1],
        dst_host=dst[0],
        dst_port=dst[1],
        target_port=target_port,
    )


def relay_state(ctl, relay: str) -> dict:
    return next(r for r in ctl.call(None, "dataplane.state")["relays"] if r["address"] == relay)


def open_pair(relay: str, rank) -> tuple[socket.socket, socket.socket]:
    """A connection through the relay: (the src rank's end, the dst rank's end)."""
    client = socket.create_connection(address(relay), timeout=5)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, rank.accept()


def test_spec_carries_the_fibre_map():
    assert TwinSpec.from_json(SPEC.to_json()).fibres == SPEC.fibres
    assert "fibres" not in TwinSpec(SPEC.devices).to_json()  # unchanged twin input without a fibre map
    with pytest.raises(ValueError, match="fibres"):
        TwinSpec.from_json('{"devices": [], "fibres": {"host": "x"}}')


def test_no_circuit_no_connection(ctl, rank):
    relay = link(ctl, rank.port)
    assert address(relay)[0] == "127.0.0.1"
    assert link(ctl, rank.port) == relay  # the same arguments give the same relay
    assert refused(relay)
    state = relay_state(ctl, relay)
    assert state["lit"] is False and state["refused"] == 1 and state["accepted"] == 0
    assert "ocs1 holds no circuit 1->10" in state["forward"]["why"]
    assert state["src"] == {"host": "gpu01", "port": "p0"} and state["target"] == f"127.0.0.1:{rank.port}"
    events = ctl.call(None, "dataplane.state")["events"]
    assert [e["event"] for e in events] == ["refused"]


def test_one_direction_is_not_enough(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};*OPC?") == ["1"]
    path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p0", dst_host="gpu02", dst_port="p0")
    assert path["forward"]["lit"] is True and path["backward"]["lit"] is False and path["lit"] is False
    assert refused(relay)


def test_both_directions_lit_carry_data_both_ways(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
    client, server = open_pair(relay, rank)
    with client, server:
        client.sendall(b"gradient" * 1000)
        assert recv_exact(server, 8000) == b"gradient" * 1000
        server.sendall(b"ack")
        assert recv_exact(client, 3) == b"ack"
        client.shutdown(socket.SHUT_WR)  # half-close passes through
        assert server.recv(1) == b""
        server.sendall(b"late")
        assert recv_exact(client, 4) == b"late"
    state = relay_state(ctl, relay)
    assert state["lit"] is True and state["accepted"] == 1 and state["refused"] == 0 and state["cut"] == 0
    assert state["bytes_forward"] == 8000 and state["bytes_backward"] == 7


def test_removing_a_circuit_cuts_open_connections_and_refuses_new_ones(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
    client, server = open_pair(relay, rank)
    with client, server:
        client.sendall(b"x")
        assert recv_exact(server, 1) == b"x"
        sent_at = time.monotonic()  # the twin's clock too: it runs on this machine (CLOCK_MONOTONIC)
        scpi("ocs1", ":OXC:SWIT:CONN:SUB (@2)")  # the return direction only
        # Reset, not left open until some TCP timeout (wait_reset raises if nothing comes within its timeout);
        # how soon is the twin's check interval, not a figure a busy machine keeps, so not asserted.
        wait_reset(client)
        server.settimeout(5)
        with pytest.raises(ConnectionResetError):  # an RST on the other side too, not a FIN
            server.recv(1)
    assert refused(relay)
    state = relay_state(ctl, relay)
    assert state["cut"] == 1 and state["open"] == 0 and state["refused"] == 1
    assert "ocs1 holds no circuit 2->9" in state["backward"]["why"]
    cut = [e for e in ctl.call(None, "dataplane.state")["events"] if e["event"] == "cut"]
    assert len(cut) == 1 and "2->9" in cut[0]["why"]
    assert cut[0]["t"] >= sent_at  # cut because of this change, after it was sent (the twin's own record)


def test_a_failed_port_cuts_the_path(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
    client, server = open_pair(relay, rank)
    with client, server:
        failed_at = time.monotonic()
        ctl.call("ocs1", "fail_port", port=10)
        wait_reset(client)  # raises if the connection is not cut within its timeout
    assert "port 10 is failed" in relay_state(ctl, relay)["forward"]["why"]
    cut = [e for e in ctl.call(None, "dataplane.state")["events"] if e["event"] == "cut"]
    assert len(cut) == 1 and "port 10 is failed" in cut[0]["why"] and cut[0]["t"] >= failed_at
    ctl.call("ocs1", "restore_port", port=10)
    assert relay_state(ctl, relay)["lit"] is True


def test_a_wrong_circuit_is_not_a_path(ctl, scpi, rank):
    to_gpu02 = link(ctl, rank.port)
    # gpu01 <-> gpu03 instead of gpu02
    assert scpi("ocs1", ":OXC:SWIT:CONN:ADD (@1,3),(@11,9);*OPC?") == ["1"]
    assert refused(to_gpu02)
    why = relay_state(ctl, to_gpu02)["forward"]["why"]
    assert "holds no circuit 1->10 (it holds 1->11)" in why
    path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p0", dst_host="gpu03", dst_port="p0")
    assert path["lit"] is True
    to_gpu03 = link(ctl, rank.port, dst=("gpu03", "p0"))
    assert to_gpu03 != to_gpu02
    client, server = open_pair(to_gpu03, rank)
    with client, server:
        client.sendall(b"ok")
        assert recv_exact(server, 2) == b"ok"


def test_hosts_on_two_switches_without_trunks_are_dark(ctl, scpi):
    # This twin has no trunks between ocs1 and ocs2 (tests/dataplane/test_multihop.py has them).
    path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p0", dst_host="gpu04", dst_port="p0")
    assert path["lit"] is False and path["forward"]["why"] == "ocs1 holds no circuit from 1"
    assert scpi("ocs2", ":OXC:SWIT:CONN:ADD (@1,2),(@6,5);*OPC?") == ["1"]
    path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p1", dst_host="gpu04", dst_port="p0")
    assert path["lit"] is True  # the second switch serves its own hosts


def test_a_moving_switch_is_dark_until_it_settles(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    ctl.call("ocs1", "set_switching_time", ms=200.0, jitter_ms=0.0)
    t0 = time.monotonic()
    # The query answers at once (no *OPC?): the circuits are held, the switch still moving.
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};:OXC:SWIT:CONN:STAT?") == [
        "(@1,2),(@10,9)"
    ]
    path = ctl.call(None, "dataplane.path", src_host="gpu01", src_port="p0", dst_host="gpu02", dst_port="p0")
    assert path["lit"] is False and "moving" in path["forward"]["why"]
    assert refused(relay)
    while not relay_state(ctl, relay)["lit"]:  # a switch that never settles is pytest-timeout's to fail
        pass
    # A lower bound of the model: no light before the 200 ms move ends, however busy the machine.
    assert time.monotonic() - t0 >= 0.19
    client, server = open_pair(relay, rank)
    with client, server:
        client.sendall(b"after")
        assert recv_exact(server, 5) == b"after"
        # Re-pointing the circuit moves its ports again: the open connection is cut at once, while they move,
        # not once the move ends. The twin's own records say which: the cut's time against the end of the move
        # (a long one, so that the order is the model's and not the machine's speed).
        ctl.call("ocs1", "set_switching_time", ms=2000.0, jitter_ms=0.0)
        scpi("ocs1", ":OXC:SWIT:CONN:ADD (@1),(@11)")
        wait_reset(client)
    cut = [e for e in ctl.call(None, "dataplane.state")["events"] if e["event"] == "cut"]
    assert len(cut) == 1 and "holds no circuit 1->10 (it holds 1->11)" in cut[0]["why"], cut
    assert cut[0]["t"] < ctl.call("ocs1", "state")["settled_at"]


def test_reset_closes_relays(ctl, scpi, rank):
    relay = link(ctl, rank.port)
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
    client, server = open_pair(relay, rank)
    with client, server:
        ctl.call(None, "dataplane.reset")
        wait_reset(client)
    assert ctl.call(None, "dataplane.state")["relays"] == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address(relay), timeout=5).close()


@pytest.mark.parametrize(
    "device, args, message",
    [
        (
            None,
            {"src_host": "gpu09", "src_port": "p0", "dst_host": "gpu02", "dst_port": "p0", "target_port": 1},
            "gpu09:p0 is not in",
        ),
        (
            None,
            {"src_host": "gpu01", "src_port": "p0", "dst_host": "gpu02", "dst_port": "p0", "target_port": 0},
            "target_port",
        ),
        (None, {"src_host": "gpu01"}, "missing"),
        ("ocs1", {}, "twin-wide op"),
    ],
)
def test_bad_requests_name_the_problem(ctl, device, args, message):
    with pytest.raises(TwinControlError, match=message):
        ctl.call(device, "dataplane.link", **args)
    with pytest.raises(TwinControlError, match="dataplane ops"):
        ctl.call(None, "dataplane.explode")
