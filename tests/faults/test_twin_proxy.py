"""The twin's fault proxy: what it announces, and its proxy.* control ops."""

from __future__ import annotations

import pytest
from fault_harness import OCS, SPEC
from raw_scpi import ask

from emulators.control import TwinControlError
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess


def idn(address: str) -> str:
    return ask(address, "*IDN?", timeout=5)[0]


def test_spec_field_round_trips_and_is_left_out_when_off():
    assert TwinSpec.from_json(SPEC.to_json()).fault_proxy is True
    off = TwinSpec(SPEC.devices)
    assert "fault_proxy" not in off.to_json()  # the twin's input is unchanged when it is off
    assert TwinSpec.from_json(off.to_json()).fault_proxy is False
    with pytest.raises(ValueError, match="fault_proxy"):
        TwinSpec.from_json('{"devices": [], "fault_proxy": "yes"}')


def test_endpoints_lead_through_the_proxy(twin, ctl):
    ends = twin.endpoints.devices["ocs1"]
    proxy_port = ends["tcp"].rsplit(":", 1)[1]
    assert ends["visa"] == f"TCPIP0::127.0.0.1::{proxy_port}::SOCKET"
    assert ends["tcp_direct"] != ends["tcp"]
    state = ctl.call("ocs1", "proxy.state")
    assert state["listen"] == ends["tcp"] and state["upstream"] == ends["tcp_direct"]
    assert state["seed"] == OCS.seed and state["enabled"] is True and state["toxics"] == []
    assert idn(ends["tcp"]) == idn(ends["tcp_direct"]) == OCS.idn


def test_control_ops(twin, ctl):
    ends = twin.endpoints.devices["ocs1"]
    toxic = ctl.call(
        "ocs1", "proxy.add_toxic", name="lag", type="latency", stream="downstream", attributes={"latency": 5}
    )
    assert toxic == {
        "name": "lag",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 5, "jitter": 0},
    }
    updated = ctl.call("ocs1", "proxy.update_toxic", name="lag", attributes={"jitter": 1})
    assert updated["attributes"] == {"latency": 5, "jitter": 1}
    assert idn(ends["tcp"]) == OCS.idn
    assert any("lag" in c["toxics"] for c in ctl.call("ocs1", "proxy.connections"))
    ctl.call("ocs1", "proxy.remove_toxic", name="lag")
    assert ctl.call("ocs1", "proxy.state")["toxics"] == []

    ctl.call("ocs1", "proxy.set_enabled", enabled=False)
    with pytest.raises(ConnectionRefusedError):
        idn(ends["tcp"])
    assert idn(ends["tcp_direct"]) == OCS.idn  # the device itself is untouched
    ctl.call("ocs1", "proxy.add_toxic", name="stall", type="timeout", attributes={"timeout": 0})
    ctl.call("ocs1", "proxy.reset")
    state = ctl.call("ocs1", "proxy.state")
    assert state["enabled"] is True and state["toxics"] == []
    assert idn(ends["tcp"]) == OCS.idn

    for device, op, args, message in [
        ("ocs1", "proxy.add_toxic", {"name": "x", "type": "gremlins"}, "unknown toxic type"),
        ("ocs1", "proxy.add_toxic", {"name": "x", "type": "latency", "attributes": [1]}, "attributes"),
        ("ocs1", "proxy.remove_toxic", {"name": "nope"}, "not found"),
        ("ocs1", "proxy.set_enabled", {"enabled": "no"}, "true or false"),
        ("ocs1", "proxy.explode", {}, "unknown proxy op"),
        ("nope", "proxy.state", {}, "unknown device"),
        (None, "proxy.state", {}, "needs a device"),
    ]:
        with pytest.raises(TwinControlError, match=message):
            ctl.call(device, op, **args)
    assert ctl.ping()


def test_without_the_field_there_is_no_proxy():
    with TwinProcess(TwinSpec(SPEC.devices)) as tw:
        ends = tw.endpoints.devices["ocs1"]
        assert "tcp_direct" not in ends
        port = ends["tcp"].rsplit(":", 1)[1]
        assert ends["visa"] == f"TCPIP0::127.0.0.1::{port}::SOCKET"
        with pytest.raises(TwinControlError, match="no fault proxy"):
            tw.control.call("ocs1", "proxy.state")
        with pytest.raises(TwinControlError, match="no fault proxy"):
            tw.control.call(None, "proxy.reset")
