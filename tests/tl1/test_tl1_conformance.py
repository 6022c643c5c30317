"""Each TL1 driver against its emulated front end, over real TCP in the twin: the circuit-switch conformance
suite, then what the suite does not cover (one switch seen through SCPI and TL1, timing, alarms between
responses, the in-progress acknowledgment, the audit log replayed as `testbed check` does).
"""

from __future__ import annotations

import time

import pytest
from tl1_harness import CALIENT, LIT, POLATIS, SIZE, SWITCHING_MS

from drivers.capabilities import CircuitSwitch, Identity
from drivers.errors import DeviceCommandError
from drivers.scpi.polatis import PolatisScpi
from drivers.tl1 import calient_tl1_audit, polatis_tl1_audit
from drivers.transports import TransportSettings, open_transport
from testbed.conformance import circuit_switch_suite


@pytest.fixture
def polatis_tl1(make_driver):
    return make_driver(POLATIS)


@pytest.fixture
def calient_tl1(make_driver):
    return make_driver(CALIENT)


test_polatis_tl1_conforms = circuit_switch_suite("polatis_tl1", size=SIZE, lit_ingress=[3])
test_calient_tl1_conforms = circuit_switch_suite("calient_tl1", size=SIZE, lit_ingress=[3])

AUDIT = {POLATIS: polatis_tl1_audit, CALIENT: calient_tl1_audit}


def test_identity_and_size(make_driver):
    polatis, calient = make_driver(POLATIS), make_driver(CALIENT)
    assert isinstance(polatis, CircuitSwitch) and isinstance(calient, CircuitSwitch)
    assert polatis.identify() == Identity("Polatis", "N-OST-32x32-LU1-DMHNS", "000001", "6.5.2.18")
    assert calient.identify() == Identity("Calient", "S320", "000001", "6.5.2.18")
    assert polatis.size() == calient.size() == (SIZE, SIZE)


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_connect_answers_once_the_mirrors_have_settled(make_driver, device):
    drv = make_driver(device)
    drv.size()
    start = time.monotonic()
    drv.connect([(3, SIZE + 1), (SIZE + 2, 4)])  # the second pair egress first: the driver orders it
    # COMPLD came after the move: a lower bound of the model (no answer before the switching time), which a busy
    # machine cannot break; the margin is the clocks' rounding.
    assert time.monotonic() - start >= SWITCHING_MS / 1000 * 0.9
    power = drv.port_power([SIZE + 1, SIZE + 2, SIZE + 3, 3])
    assert power == {SIZE + 1: LIT[3] - 1.0, SIZE + 2: LIT[4] - 1.0, SIZE + 3: -99.99, 3: LIT[3]}
    drv.disconnect([(3, SIZE + 1)])
    assert drv.connections() == {4: SIZE + 2}


def test_one_switch_two_interfaces(make_driver, tl1_twin):
    """SCPI and TL1 change and read the same circuits of the same switch."""
    tl1 = make_driver(POLATIS)
    scpi = PolatisScpi(open_transport(TransportSettings("visa", tl1_twin.endpoints.devices[POLATIS]["visa"]), "x"), "x")
    try:
        tl1.connect([(1, 17)])
        scpi.connect([(2, 18)])
        assert tl1.connections() == scpi.connections() == {1: 17, 2: 18}
        scpi.set_port_enabled([5], False)
        assert tl1.port_states([5, 6]) == {5: "D", 6: "E"}
    finally:
        scpi.close()


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_a_refused_connect_names_the_port_range(make_driver, tl1_twin, device):
    drv = make_driver(device)
    drv.connect([(1, SIZE + 1)])
    with pytest.raises(DeviceCommandError) as info:
        drv.connect([(2, SIZE + 1)])  # that egress carries a circuit already
    err = info.value
    assert err.device == device and err.address == "admin@" + tl1_twin.endpoints.devices[device]["tl1"]
    assert err.sent.startswith("ENT-") and "DENY" in err.received
    assert "SNVS" in str(err) and "in use" in err.hint
    assert drv.connections() == {1: SIZE + 1}
    with pytest.raises(DeviceCommandError) as info:
        drv.connect([(1, 3 * SIZE)])
    assert f"{SIZE + 1}..{2 * SIZE}" in info.value.hint


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_alarms_arrive_between_responses_and_fail_the_port(make_driver, tl1_twin, device):
    drv = make_driver(device)
    drv.connect([(3, SIZE + 1)])
    alarms = drv.transport.autonomous
    alarms.clear()
    tl1_twin.control.call(device, "fail_port", port=3)
    while not alarms:  # an alarm that never comes is pytest-timeout's to fail, not a deadline's
        assert drv.connections() == {3: SIZE + 1}  # answers keep matching their commands meanwhile
        time.sleep(0.005)
    (alarm,) = alarms
    assert (alarm.kind, alarm.code, alarm.verb) == ("autonomous", "**", "REPT ALM")
    assert ":MJ,FAIL," in alarm.lines[0]
    assert drv.port_states([3, 4]) == {3: "F", 4: "E"}
    tl1_twin.control.call(device, "restore_port", port=3)
    while len(alarms) < 2:
        drv.wait_settled()
        time.sleep(0.005)
    assert alarms[-1].code == "A" and ":CL,FAIL," in alarms[-1].lines[0]
    assert drv.port_states([3]) == {3: "E"}


def test_a_slow_move_is_acknowledged_in_progress(make_driver, tl1_twin):
    """Over 2 s to settle: the switch sends `IP <ctag>` and `<` at once; the driver waits on for COMPLD."""
    records = []
    drv = make_driver(POLATIS, audit=records.append, timeout_s=4.0)
    tl1_twin.control.call(POLATIS, "set_switching_time", ms=2100, jitter_ms=0)
    try:
        start = time.monotonic()
        drv.connect([(1, 17)])
        assert time.monotonic() - start >= 2.0  # a lower bound of the model: not settled before 2.1 s
    finally:
        tl1_twin.control.call(POLATIS, "set_switching_time", ms=SWITCHING_MS, jitter_ms=0)
    received = "".join(r.data for r in records if r.direction == "rx")
    ctag = [r.data for r in records if r.direction == "tx"][-1].split(":")[3]
    assert f"IP {ctag}\r\n<" in received
    assert received.index(f"IP {ctag}") < received.index(f"M  {ctag} COMPLD")


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_the_audit_log_replays_to_what_the_switch_holds(make_driver, device):
    """`testbed check` in small: the tx records through the driver's audit model give the circuits read back."""
    records = []
    drv = make_driver(device, audit=records.append)
    drv.connect([(1, SIZE + 1), (2, SIZE + 2), (3, SIZE + 3)])
    drv.disconnect([(2, SIZE + 2)])
    drv.connect([(2, SIZE + 1)], check=False)  # refused: egress in use
    with pytest.raises(DeviceCommandError):
        drv.check_errors()
    drv.set_port_enabled([4], False)
    drv.connect([(4, SIZE + 4)])
    sent = [r.data for r in records if r.direction == "tx"]
    assert sent[0].startswith("ACT-USER::admin:1::***;")  # the password never reaches the audit
    assert not any("twin" in r.data for r in records)
    model = AUDIT[device](SIZE)
    assert model.replay({}, sent) == drv.connections() == {1: SIZE + 1, 3: SIZE + 3, 4: SIZE + 4}
    written = {p for line in sent for w in model.writes(line) for p in w.ports}
    assert written == {1, 2, 3, 4, SIZE + 1, SIZE + 2, SIZE + 3, SIZE + 4}


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_commands_in_flight_together_move_together(make_driver, device):
    """A change sent with check=False is not waited for: the moves of a whole rail change overlap (TL1's
    CTAGs match the answers up later), where waiting for each COMPLD would add up every switching time. (How
    long the change takes is a speed: bench/switch_protocols.py measures the TL1 drivers' cycle.)
    """
    records = []
    drv = make_driver(device, audit=records.append)
    drv.size()
    old = [(i, SIZE + i) for i in range(1, 13)]
    new = [(i, SIZE + 13 - i) for i in range(1, 13)]
    drv.connect(old)
    before = len(records)
    drv.disconnect(old, check=False)
    drv.connect(new, check=False)
    drv.check_errors("the rail change")
    drv.wait_settled()
    assert drv.connections() == dict(new)
    # Every change of the rail went out before the first answer was read (the driver's audit, in the order of
    # its own sends and reads, not a clock): waiting for each COMPLD would put an answer after each change.
    change = records[before:]
    first_answer = next(k for k, r in enumerate(change) if r.direction == "rx")
    changes_sent = [r.data for r in change if r.direction == "tx" and not r.data.startswith("RTRV-")]
    assert len(changes_sent) == (48 if device == CALIENT else 2)  # Calient: CANC+DLT, ENT+ACT per circuit
    assert [r.data for r in change[:first_answer]] == changes_sent


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_a_refusal_sent_with_check_false_is_raised_by_check_errors_once(make_driver, device):
    drv = make_driver(device)
    drv.connect([(1, SIZE + 1)])
    drv.connect([(2, SIZE + 1), (3, SIZE + 3)], check=False)  # the first refused: egress in use
    with pytest.raises(DeviceCommandError) as info:
        drv.check_errors("the change")
    assert "SNVS" in str(info.value)
    drv.check_errors()  # reported once
    expected = {1: SIZE + 1} if device == POLATIS else {1: SIZE + 1, 3: SIZE + 3}
    assert drv.connections() == expected  # Polatis: one command for both, refused whole; Calient: one each
