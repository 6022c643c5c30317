"""The Polatis SCPI driver against pyvisa-sim (pyvisa's own simulator, unmodified) answering from the project's
definition of the switch, drivers/scpi/polatis-sim.yaml, selected as a lab selects it: `visa_library: FILE@sim`.

pyvisa-sim is a second SCPI peer we did not write: its dialogue matching, its error queue, its terminations and
its VISA library (no viFlush, so the transport's drain runs) are its own. The circuit-switch conformance suite
runs against it as against the twin, and passes every check pyvisa-sim can model:
capability, identify, size, out_of_range_deferred, out_of_range_port_power, out_of_range_port_states.

What it cannot model, so the definition leaves it out (the switch refuses it) and the checks below fail, each for
the reason pinned in UNMODELLED:

- disconnect_all, connect, disconnect, check_errors, out_of_range_connect: they make a circuit with
  `:OXC:SWIT:CONN:ADD`. pyvisa-sim keeps state only in properties; a property has one setter, and a query is
  answered from one property, so `:OXC:SWIT:CONN:STAT?` could follow ADD or DISC:ALL but never both, and a
  setter stores the text it matched, so ADD cannot add to a circuit list nor SUB take one away. A definition
  that accepted ADD would report circuits that are not there; this one keeps an empty switch and refuses ADD.
- port_states: the driver reads the states of several ports in one query (`:OXC:SWIT:PORT:STAT? (@1,17)`);
  a pyvisa-sim channel answers for one channel per query, and a channel setter takes any text as its channel
  id (`(@17,18)` would be stored as one channel "17,18"), so port states are read-only, one port at a time.
- light: not run; the definition has no optical model (every port reads -99.99 dBm, dark).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from peers import require_peer

from drivers.errors import DeviceCommandError
from drivers.scpi.polatis import PolatisScpi
from drivers.transports import TransportSettings, open_transport
from testbed.conformance import FAILED, check_circuit_switch, circuit_switch_suite

require_peer("pyvisa_sim", "pyvisa-sim is the independent SCPI peer of the Polatis driver (docs/interop.md)")

SIM_FILE = "drivers/scpi/polatis-sim.yaml"
SOCKET = "TCPIP0::polatis-sim::5025::SOCKET"
SERIAL = "ASRL1::INSTR"
SIZE = 16
# A query the simulated switch refuses gets no reply: each costs one timeout, so keep it short.
TIMEOUT_S = 0.2
MODELLED = (
    "capability",
    "identify",
    "size",
    "out_of_range_deferred",
    "out_of_range_port_power",
    "out_of_range_port_states",
)
REFUSED_ADD = "the switch refused ':OXC:SWIT:CONN:ADD"
UNMODELLED = {
    "disconnect_all": REFUSED_ADD,
    "connect": REFUSED_ADD,
    "disconnect": REFUSED_ADD,
    "check_errors": "the switch refused 'the previous commands'",  # the ADD sent with check=False
    "out_of_range_connect": REFUSED_ADD,  # the refusal of (1, 33) passes; the good connect after it is refused
    "port_states": "the switch refused ':OXC:SWIT:PORT:STAT? (@1,17)'",
}


SIM_LIBRARY = f"{Path(__file__).resolve().parents[2] / SIM_FILE}@sim"


def make_switch(resource: str) -> PolatisScpi:
    audit: list = []
    settings = TransportSettings("visa", resource, TIMEOUT_S, visa_library=SIM_LIBRARY)
    driver = PolatisScpi(open_transport(settings, "ocs-sim", audit.append), "ocs-sim")
    driver.audit = audit
    return driver


@pytest.fixture(params=[SOCKET, SERIAL], ids=["socket", "serial"])
def sim_switch(request):
    driver = make_switch(request.param)
    yield driver
    driver.close()


test_conformance_on_pyvisa_sim = circuit_switch_suite(
    {"socket": lambda: make_switch(SOCKET), "serial": lambda: make_switch(SERIAL)}, size=SIZE, checks=MODELLED
)


@pytest.mark.parametrize("check", list(UNMODELLED))
def test_what_pyvisa_sim_cannot_model_is_refused_not_faked(sim_switch, check):
    """The switch refuses what the definition cannot model, and the driver says so as it would for a lab's switch."""
    (result,) = check_circuit_switch(sim_switch, size=SIZE, checks=[check])
    assert result.status == FAILED
    assert UNMODELLED[check] in result.detail
    assert "DeviceCommandError" in result.detail and "ocs-sim" in result.detail
    assert "not modelled by polatis-sim.yaml" in result.detail  # the simulator's own error text says why


def test_a_refused_change_names_the_device_the_resource_and_the_reply(sim_switch):
    with pytest.raises(DeviceCommandError) as caught:
        sim_switch.connect([(1, 17)])
    err = caught.value
    assert err.device == "ocs-sim" and err.address in (SOCKET, SERIAL)
    assert err.sent == ":OXC:SWIT:CONN:ADD (@1),(@17)"
    assert err.received.startswith('-100,"Command error; not modelled by polatis-sim.yaml')
    assert sim_switch.connections() == {}  # the refusal changed nothing, and the error queue was drained
    sim_switch.check_errors()


def test_reads_answer_as_the_definition_says(sim_switch):
    assert sim_switch.size() == (SIZE, SIZE)
    assert sim_switch.port_power([17]) == {17: -99.99}
    assert sim_switch.port_states([3]) == {3: "E"}
    sim_switch.set_port_enabled([3], True)  # enabling an enabled port: accepted, nothing changes
    sim_switch.disconnect_all()
    sim_switch.wait_settled()
    assert sim_switch.connections() == {}


def test_a_reply_nobody_read_is_drained_not_taken_as_the_next_answer(sim_switch):
    """pyvisa-sim has no viFlush: the transport drains instead, records what it drained and says so once."""
    transport = sim_switch.transport
    transport.write("*IDN?")  # the switch answers; nobody reads it
    assert transport.query(":OXC:SWIT:SIZE?") == "16,16"
    assert transport.query("*OPC?") == "1"
    notes = [r for r in sim_switch.audit if r.direction == "note"]
    assert len(notes) == 1
    assert "cannot flush" in notes[0].data and "polatis-sim.yaml@sim" in notes[0].data
    received = [r.data for r in sim_switch.audit if r.direction == "rx"]
    assert received[0] == "Polatis,N-OST-16x16-SIM,PYVISA-SIM,polatis-sim.yaml\r\n"  # the drained reply
    assert received[1:] == ["16,16\r\n", "1\r\n"]
