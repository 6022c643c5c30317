"""Driver x fault matrix, link.down row: every OCS driver (Polatis SCPI, Polatis TL1, Calient TL1, Polatis
NETCONF) takes a link's switch ports out of service and back through the runner's own device actor (the
family's procedures, the inventory's interlock guard), against the twin's switch over TCP.

For each driver, what link.down relies on:
- disabling ports keeps the circuits and darkens them: the switch's power monitor reads dark where the light
  crossed a disabled port, and each port reads D; the moment is marked (`fault_injected`);
- the driver's audit model names exactly the disabled ports as written and replays no circuit change, so
  `testbed check` neither misses the write nor sees the fabric move;
- enabling them brings the light back (E);
- a reserved port is refused by the actor's guard before anything is sent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from drivers.audit import ALL_PORTS
from emulators.frontends import TWIN_PASSWORD, TWIN_PASSWORD_ENV
from emulators.twin import TwinProcess
from testbed.documents.inventory import Inventory
from testbed.families import family_of
from testbed.families.drivers import driver_spec, make_driver
from testbed.twin.bridge import point_at_twin, twin_spec

DRIVERS = {  # switch -> (driver, transport as a lab's inventory gives it)
    "scpi1": ("polatis-scpi", {"type": "visa", "resource": "TCPIP0::192.0.2.10::5025::SOCKET"}),
    "tl1p": ("polatis-tl1", {"type": "tl1", "host": "192.0.2.11", "port": 3082, "user": "admin", "password_env": "P"}),
    "tl1c": ("calient-tl1", {"type": "tl1", "host": "192.0.2.12", "port": 3083, "user": "admin", "password_env": "P"}),
    "nc1": ("polatis-netconf", {"type": "netconf", "host": "192.0.2.13", "user": "admin", "password_env": "P"}),
}
SIZE = 8  # ingress 1..8, egress 9..16
RESERVED = 8
# gpu01:pN transmits into ingress 1 and receives from egress 9; gpu02:pN: ingress 2, egress 10.
LINK = (1, 9)  # gpu01's fibre on each switch: the ports link.down on gpu01:pN disables
CIRCUITS = [(1, 10), (2, 9)]  # gpu01 <-> gpu02, both directions


def inventory() -> Inventory:
    devices: dict = {
        name: {
            "kind": "ocs",
            "driver": driver,
            "transport": transport,
            "size": SIZE,
            "reserved_ports": [RESERVED],
            "emulation": {"switching_time_ms": 5, "jitter_ms": 0},
        }
        for name, (driver, transport) in DRIVERS.items()
    }
    ports = [f"p{k}" for k in range(len(DRIVERS))]
    for host in ("gpu01", "gpu02"):
        devices[host] = {
            "kind": "gpu_host",
            "driver": "ssh",
            "transport": {"type": "ssh", "host": f"{host}.example", "user": "lab"},
            "ports": ports,
        }
    fibres = [
        {"host": host, "port": port, "switch": switch, "ingress": i, "egress": 8 + i}
        for port, switch in zip(ports, DRIVERS, strict=True)
        for i, host in ((1, "gpu01"), (2, "gpu02"))
    ]
    return Inventory.model_validate({"name": "four-switches", "devices": devices, "fibres": fibres})


@pytest.fixture(scope="module")
def lab() -> Iterator[Inventory]:
    """The twin of the four switches, and the inventory pointed at it (as `--emulate` points a run)."""
    inv = inventory()
    before = os.environ.get(TWIN_PASSWORD_ENV)
    os.environ[TWIN_PASSWORD_ENV] = TWIN_PASSWORD  # the transports pointed at the twin read its password here
    try:
        with TwinProcess(twin_spec(inv, 0, only=set(DRIVERS))) as twin:
            yield point_at_twin(inv, twin.endpoints.to_json())
    finally:
        if before is None:
            os.environ.pop(TWIN_PASSWORD_ENV, None)
        else:
            os.environ[TWIN_PASSWORD_ENV] = before


def actor_for(inv: Inventory, name: str):
    """The runner's DeviceActor, in process, with the family's interlock policy on every write."""
    from testbed.engine.device_actor import DeviceActor

    dev = inv.devices[name]
    interval = sys.getswitchinterval()
    try:
        return DeviceActor(name, dev.driver, dev.transport.settings(), family_of(dev).policy(name, dev), dev.kind)
    finally:
        sys.setswitchinterval(interval)  # the actor tunes the interpreter for a Ray worker, not for pytest


def ok(actor, procedure: str, kwargs: dict):
    result = actor.run(procedure, kwargs)
    assert result.status == "ok", result.error
    return result


def sent(result) -> list[str]:
    return [r.data for r in result.audit if r.direction == "tx"]


@pytest.mark.parametrize("switch", list(DRIVERS), ids=[d for d, _ in DRIVERS.values()])
def test_link_down_through_each_driver(lab, switch):
    dev = lab.devices[switch]
    actor = actor_for(lab, switch)
    reader = make_driver(dev.driver, switch, dev.transport.settings())  # a second client: what the switch shows
    model = driver_spec(dev.driver).audit_model(SIZE)
    try:
        setup = ok(actor, "ocs.reconfigure", {"circuits": CIRCUITS, "managed": [1, 2, 9, 10], "verify_light": True})
        lit = reader.port_power([9, 10])
        assert all(dbm > -20 for dbm in lit.values()), lit  # both directions of the link carry light

        down = ok(actor, "ocs.disable_ports", {"ports": list(LINK)})
        assert down.value["states"] == {1: "D", 9: "D"}
        injected = down.marks["fault_injected"][0]
        assert down.start[0] <= injected <= down.end[0]
        assert reader.port_states([1, 2, 9, 10]) == {1: "D", 2: "E", 9: "D", 10: "E"}
        assert reader.connections() == dict(CIRCUITS)  # the circuits stay
        dark = reader.port_power([9, 10])  # 1->10 enters through disabled 1; 2->9 leaves through disabled 9
        assert dark == {9: -99.99, 10: -99.99}, dark

        # The audit model sees the write, with exactly these ports, and no change of circuits.
        writes = [w for line in sent(down) for w in model.writes(line)]
        assert writes and all(w.ports is not ALL_PORTS for w in writes)
        assert set().union(*(w.ports for w in writes)) == set(LINK)
        assert model.replay(dict(CIRCUITS), sent(setup) + sent(down)) == dict(CIRCUITS)

        refused = actor.run("ocs.disable_ports", {"ports": [RESERVED]})
        assert refused.status == "fail" and refused.error_type == "InterlockError"
        assert f"[{RESERVED}]" in refused.error and "reserved" in refused.error
        assert sent(refused) == []  # refused before anything went out
        assert reader.port_states([RESERVED]) == {RESERVED: "E"}

        up = ok(actor, "ocs.enable_ports", {"ports": list(LINK)})
        assert up.value["states"] == {1: "E", 9: "E"} and "fault_healed" in up.marks
        assert reader.port_states([1, 9]) == {1: "E", 9: "E"}
        back = reader.port_power([9, 10])
        assert back == lit
    finally:
        ok(actor, "ocs.clear", {"managed": [1, 2, 9, 10]})
        actor.close()
        reader.close()


def test_a_driver_without_port_control_is_refused_naming_it():
    """link.down on a switch whose driver cannot disable ports fails before sending anything, naming the
    driver (every driver of this project can: a plugin's may not).
    """
    from testbed.families.context import ProcedureContext
    from testbed.families.ocs import procedures

    class CircuitsOnly:  # a third-party driver that only makes circuits
        def connections(self) -> dict[int, int]:
            return {}

    ctx = ProcedureContext("panel1", "tcp://192.0.2.20:7000")
    with pytest.raises(Exception, match=r"its driver \(CircuitsOnly\) cannot take ports out of service"):
        procedures.disable_ports(CircuitsOnly(), ctx, ports=[1])
    assert ctx.marks == {}
