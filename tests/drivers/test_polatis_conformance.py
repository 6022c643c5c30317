"""PolatisScpi end to end against the emulated switch, over VISA/TCP, serial/PTY and VISA/ASRL-PTY.

The twin runs in its own process (one per module); the driver cannot tell it from hardware.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from drivers.capabilities import CircuitSwitch, Identity
from drivers.errors import DeviceCommandError
from drivers.scpi.polatis import PolatisScpi
from drivers.transports import TransportSettings, open_transport
from emulators import spec as spec_mod
from emulators import twin as twin_mod

SIZE = 32  # ingress 1..32, egress 33..64
SWITCHING_MS = 25
INPUT_DBM = {1: 0.0, 2: -3.0}
INSERTION_LOSS_DB = 1.0  # the emulator's default (OcsSpec.insertion_loss_db)


@pytest.fixture(scope="module")
def twin():
    spec = spec_mod.TwinSpec(
        devices=[
            spec_mod.OcsSpec(
                name="ocs1", size=SIZE, switching_time_ms=SWITCHING_MS, jitter_ms=0, input_power_dbm=INPUT_DBM
            )
        ]
    )
    with twin_mod.TwinProcess(spec) as proc:
        yield proc


@pytest.fixture(params=["visa-tcp", "serial-pty", "visa-asrl"])
def link(request, twin):
    """(driver, audit records) for one transport; the switch starts every test from its initial state."""
    twin.control.call("ocs1", "reset")
    ends = twin.endpoints.devices["ocs1"]
    settings = {
        "visa-tcp": TransportSettings("visa", ends["visa"], timeout_s=2.0),
        "serial-pty": TransportSettings("serial", ends["serial"], timeout_s=2.0),
        "visa-asrl": TransportSettings("visa", f"ASRL{ends['serial']}::INSTR", timeout_s=2.0),
    }[request.param]
    records: list = []
    driver = PolatisScpi(open_transport(settings, "ocs1", records.append), "ocs1")
    yield driver, records
    driver.close()


def test_identify_and_size(link):
    drv, _ = link
    assert isinstance(drv, CircuitSwitch)
    ident = drv.identify()
    assert ident.vendor == "Polatis"
    assert f"{SIZE}x{SIZE}" in ident.model
    assert ident == Identity(*spec_mod.OcsSpec(name="x").idn.split(","))  # no stray "\r" on the last field
    assert drv.size() == (SIZE, SIZE)


def test_connect_settle_and_read_back(link):
    drv, _ = link
    start = time.monotonic()
    drv.connect([(1, 33), (34, 2)])  # the second pair is given egress-first: the driver reorders it
    drv.wait_settled()
    # *OPC? waits for the mirrors: the move takes the configured switching time. A lower bound of the model, which a
    # busy machine cannot break (the margin is the clocks' rounding).
    assert time.monotonic() - start >= SWITCHING_MS / 1000 * 0.9
    assert drv.connections() == {1: 33, 2: 34}


def test_disconnect_and_disconnect_all(link):
    drv, _ = link
    drv.connect([(1, 33), (2, 34), (3, 35)])
    drv.disconnect([(2, 34)])
    assert drv.connections() == {1: 33, 3: 35}
    drv.disconnect_all()
    drv.wait_settled()
    assert drv.connections() == {}


def test_port_power_lit_and_dark(link):
    drv, _ = link
    drv.connect([(1, 33)])
    drv.wait_settled()
    power = drv.port_power([33, 34, 1])
    assert power[33] == pytest.approx(INPUT_DBM[1] - INSERTION_LOSS_DB, abs=0.01)
    assert power[34] == pytest.approx(-99.99)  # no circuit: dark
    assert power[1] == pytest.approx(INPUT_DBM[1])


def test_port_states_after_fail_and_disable(link, twin):
    drv, _ = link
    twin.control.call("ocs1", "fail_port", port=3)
    drv.set_port_enabled([4], False)
    assert drv.port_states([1, 3, 4]) == {1: "E", 3: "F", 4: "D"}
    drv.set_port_enabled([4], True)
    assert drv.port_states([4]) == {4: "E"}


def test_out_of_range_port_is_a_command_error(link):
    drv, _ = link
    with pytest.raises(DeviceCommandError) as info:
        drv.connect([(1, 99)])
    err = info.value
    assert err.sent == ":OXC:SWIT:CONN:ADD (@1),(@99)"
    assert "-222" in str(err) and "Data out of range" in str(err)
    assert f"ingress 1..{SIZE} and egress {SIZE + 1}..{2 * SIZE}" in err.hint
    # The queue was drained: the next command is judged on its own.
    drv.connect([(1, 33)])
    assert drv.connections() == {1: 33}


def test_out_of_range_port_in_a_query_is_a_command_error(link):
    drv, _ = link
    # The switch answers nothing to a rejected query: keep the unavoidable wait short.
    quick = PolatisScpi(open_transport(replace(drv.transport.settings, timeout_s=0.3), "ocs1"), "ocs1")
    try:
        with pytest.raises(DeviceCommandError) as info:
            quick.port_power([1, 99])
        assert "-222" in str(info.value) and "99" in str(info.value)
        assert info.value.sent == ":PMON:POW? (@1,99)"
        assert quick.port_power([1]) == {1: pytest.approx(INPUT_DBM[1])}
    finally:
        quick.close()


def test_every_exchange_is_audited_in_order(link):
    drv, records = link
    drv.identify()
    drv.connect([(1, 33)])
    drv.wait_settled()
    sent = [r.data.strip() for r in records if r.direction == "tx"]
    assert sent == ["*IDN?", ":OXC:SWIT:CONN:ADD (@1),(@33)", ":SYST:ERR?", "*OPC?"]
    assert [r.direction for r in records] == ["tx", "rx", "tx", "tx", "rx", "tx", "rx"]
    assert records[1].data.startswith("Polatis,")
    stamps = [r.mono_ns for r in records]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))
    assert all(r.device == "ocs1" and r.address == drv.transport.address for r in records)
