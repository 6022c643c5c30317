"""The mesh drivers fed garbage, truncated and wrong-count replies by a scripted device on a real TCP port:
every call ends in a typed DeviceError naming what was sent and what came back, never a raw ValueError,
ZeroDivisionError or numpy error (and never a NaN or infinite drive computed from a reply).

scpi-mesh runs over VISA (pyvisa-py), qontrol-mesh over the serial transport (pyserial's socket:// URL:
the same transport class as on a pty or a USB adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from socket_servers import Reply, ScriptedServer

from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.mesh import QontrolMesh, ScpiMesh
from drivers.mesh.calibration import Calibration, HeaterCal
from drivers.transports import TransportSettings, open_transport

TIMEOUT = 1.0  # generous: a 5000-byte reply over socket:// is read a byte per select() on a busy machine
HEATERS = 4  # a 2x2 chip: 2N(N-1) heaters

SCPI_HEALTHY: dict[str, str] = {
    "*IDN?": "Testbed,MZI-MESH,000001,1.0",
    "SOUR:CHAN:COUN?": "4",
    "*OPC?": "1",
    ":SYST:ERR?": '0,"No error"',
    "MEAS:POW? (@3:4)": "-3.0,-3.1",
    "MEAS:VOLT? (@1,2,3,4)": "5,5,5,5",
    "MEAS:CURR? (@1,2,3,4)": "0.005,0.005,0.005,0.005",
    "SOUR1:CURR?": "0.001",
}
QONTROL_HEALTHY: dict[str, str] = {
    "id?": "Q8iv-0A1B",
    "firmware?": "v2.4.1",
    "nchan?": "4",
    "pdpall?": "0.5,0.4",
    "i0?": "1.0000",
    **{f"v{h}?": "5.0000" for h in range(HEATERS)},
    "set": "OK",  # the answer to every set (`i0=1.0000`)
}


def scripted(table: dict[str, Reply]) -> Callable[[str], Reply]:
    def reply(request: str) -> Reply:
        if request in table:
            return table[request]
        if "?" not in request:  # a set: SCPI answers nothing, a Qontrol module "OK" (or what the case says)
            return table.get("set")
        return None  # an unknown query: silence (the driver times out)

    return reply


@pytest.fixture
def device() -> Iterator[Callable]:
    """device(driver, overrides) -> (driver object, server): a healthy chip but for `overrides`."""
    made: list[tuple[object, ScriptedServer]] = []

    def make(kind: str, overrides: dict[str, Reply]):
        if kind == "scpi-mesh":
            server = ScriptedServer(reply=scripted({**SCPI_HEALTHY, **overrides}), terminator=b"\n")
            drv = ScpiMesh(open_transport(TransportSettings("visa", server.visa, timeout_s=TIMEOUT), "chip1"), "chip1")
        else:
            server = ScriptedServer(reply=scripted({**QONTROL_HEALTHY, **overrides}), terminator=b"\n")
            settings = TransportSettings("serial", server.url, timeout_s=TIMEOUT, baudrate=115200)
            drv = QontrolMesh(open_transport(settings, "chip1"), "chip1")
        made.append((drv, server))
        return drv, server

    yield make
    for drv, server in made:
        drv.transport.close()
        server.stop()


OPERATIONS: dict[str, Callable] = {
    "identify": lambda d: d.identify(),
    "size": lambda d: d.size(),
    "read_drive": lambda d: d.read_drive(0),
    "output_power": lambda d: d.output_power(),
    "resistances": lambda d: d.resistances(),
    "set_drive": lambda d: d.set_drive(0, 1.0),
    "check_errors": lambda d: d.check_errors(),
}
PROTO, CMD, TMO = DeviceProtocolError, DeviceCommandError, DeviceTimeout
HUGE = "9" * 5000  # int() refuses a string this long: a raw ValueError unless the driver bounds it

# (driver, operation, replies that differ from a healthy chip, error class, words the message must hold)
CASES = [
    # identity
    ("scpi-mesh", "identify", {"*IDN?": "\x8f\xfe garbage"}, PROTO, "vendor,model,serial,firmware"),
    ("scpi-mesh", "identify", {"*IDN?": "a,b,c"}, PROTO, "vendor,model"),
    ("scpi-mesh", "identify", {"*IDN?": "a,b,c,d,e"}, PROTO, "vendor,model"),
    ("scpi-mesh", "identify", {"*IDN?": b"Testbed,MZI"}, TMO, "no complete reply"),  # truncated: no terminator
    ("qontrol-mesh", "identify", {"id?": "\x8f\xfe#?"}, PROTO, "expected an id"),
    ("qontrol-mesh", "identify", {"id?": "E10:00"}, CMD, "unrecognised command"),
    ("qontrol-mesh", "identify", {"id?": f"E{HUGE}:1"}, PROTO, "expected an id"),  # not an error line
    ("qontrol-mesh", "identify", {"id?": b"Q8iv-0"}, TMO, "a partial line arrived"),
    # the channel count: a number, whole, in range, and 2N(N-1) for a power-of-two N
    *[
        (kind, "size", {cmd: bad}, PROTO, what)
        for kind, cmd in [("scpi-mesh", "SOUR:CHAN:COUN?"), ("qontrol-mesh", "nchan?")]
        for bad, what in [
            ("four", "expected a number"),
            ("nan", "expected a number"),
            ("inf", "expected a number"),
            ("-4", "channel count"),
            ("0", "channel count"),
            ("2.5", "channel count"),
            ("1e9", "channel count"),
            (HUGE, "expected a number"),  # float() makes it inf
            ("6", "not 2N(N-1)"),
            ("12", "power-of-two"),
        ]
    ],
    # a drive level read back
    ("scpi-mesh", "read_drive", {"SOUR1:CURR?": ""}, PROTO, "expected a number"),
    ("scpi-mesh", "read_drive", {"SOUR1:CURR?": "1,2"}, PROTO, "expected a number"),
    ("scpi-mesh", "read_drive", {"SOUR1:CURR?": "NaN"}, PROTO, "expected a number"),
    ("qontrol-mesh", "read_drive", {"i0?": "OK"}, PROTO, "expected a number"),
    ("qontrol-mesh", "read_drive", {"i0?": "-inf"}, PROTO, "expected a number"),
    # photodiodes: one value per output port
    ("scpi-mesh", "output_power", {"MEAS:POW? (@3:4)": "-3.0"}, PROTO, "expected 2 dBm values, got 1"),
    ("scpi-mesh", "output_power", {"MEAS:POW? (@3:4)": "-3,-3,-3"}, PROTO, "expected 2 dBm values, got 3"),
    ("scpi-mesh", "output_power", {"MEAS:POW? (@3:4)": "-3,x"}, PROTO, "comma-separated dBm"),
    ("scpi-mesh", "output_power", {"MEAS:POW? (@3:4)": "nan,-3"}, PROTO, "comma-separated dBm"),
    ("scpi-mesh", "output_power", {"MEAS:POW? (@3:4)": ""}, PROTO, "comma-separated dBm"),
    ("qontrol-mesh", "output_power", {"pdpall?": "0.5"}, PROTO, "expected 2 mW values, got 1"),
    ("qontrol-mesh", "output_power", {"pdpall?": "0.5,,0.4"}, PROTO, "comma-separated mW"),
    ("qontrol-mesh", "output_power", {"pdpall?": "inf,0.4"}, PROTO, "comma-separated mW"),
    # heater resistances: counts, and values a drive can be computed from (no 0 ohm, no division by 0 A)
    ("scpi-mesh", "resistances", {"MEAS:VOLT? (@1,2,3,4)": "5,5,5"}, PROTO, "expected 4 voltages, got 3"),
    ("scpi-mesh", "resistances", {"MEAS:CURR? (@1,2,3,4)": "0.005,0.005"}, PROTO, "expected 4 currents, got 2"),
    ("scpi-mesh", "resistances", {"MEAS:CURR? (@1,2,3,4)": "0,0.005,0.005,0.005"}, PROTO, "not a resistance"),
    ("scpi-mesh", "resistances", {"MEAS:VOLT? (@1,2,3,4)": "0,5,5,-5"}, PROTO, "not a resistance"),
    ("scpi-mesh", "resistances", {"MEAS:VOLT? (@1,2,3,4)": "5;5;5;5"}, PROTO, "comma-separated voltages"),
    ("qontrol-mesh", "resistances", {"v1?": "0.0000"}, PROTO, "not a resistance"),
    ("qontrol-mesh", "resistances", {"v2?": "volts"}, PROTO, "expected a number"),
    # a set's acknowledgement (Qontrol answers every set)
    ("qontrol-mesh", "set_drive", {"set": "KO"}, PROTO, "expected OK"),
    ("qontrol-mesh", "set_drive", {"set": "E02:00"}, CMD, "over-current on channel 0"),
    ("qontrol-mesh", "set_drive", {"set": b"O"}, TMO, "a partial line arrived"),
    # the SCPI error queue
    ("scpi-mesh", "check_errors", {":SYST:ERR?": "what?"}, PROTO, "<code>"),
    ("scpi-mesh", "check_errors", {":SYST:ERR?": HUGE}, PROTO, "<code>"),
    ("scpi-mesh", "check_errors", {":SYST:ERR?": '-222,"Data out of range"'}, CMD, "Data out of range"),
]


@pytest.mark.parametrize(("kind", "op", "overrides", "error", "words"), CASES)
def test_bad_replies_raise_typed_errors(device, kind, op, overrides, error, words):
    drv, _ = device(kind, overrides)
    with pytest.raises(DeviceError) as info:
        OPERATIONS[op](drv)
    exc = info.value
    assert type(exc) is error or isinstance(exc, error), f"{type(exc).__name__}: {exc}"
    assert words in str(exc)
    assert exc.device == "chip1" and exc.sent and exc.hint  # names the device, what was sent, what to try


@pytest.mark.parametrize("kind", ["scpi-mesh", "qontrol-mesh"])
def test_the_healthy_script_passes(device, kind):
    """The cases above fail because of their replies, not because of the script."""
    drv, _ = device(kind, {})
    assert drv.identify().model in ("MZI-MESH", "Q8iv")
    assert drv.size() == (2, 2)
    assert drv.read_drive(0) == 1.0
    assert sorted(drv.output_power()) == [3, 4]
    assert list(drv.resistances()) == [1000.0] * HEATERS
    drv.set_drive(0, 1.0)


def calibrated(drv):
    drv.calibration = Calibration(size=2, heaters=[HeaterCal(amplitude_mw=1.0) for _ in range(HEATERS)])
    return drv


def test_after_an_unknown_outcome_the_next_program_writes_every_heater_again(device):
    # SCPI sets get no reply: when *OPC? then times out, the driver cannot know which of them landed (the
    # bytes may have died with the connection). It must not skip them next time as "already set".
    silent = {"on": True}
    drv, server = device("scpi-mesh", {})
    server.reply = lambda request: None if request == "*OPC?" and silent["on"] else scripted(SCPI_HEALTHY)(request)
    calibrated(drv)
    with pytest.raises(DeviceTimeout):
        drv.program({1: 3, 2: 4})
    first = [r for r in server.requests if r.startswith("SOUR") and "?" not in r]
    assert len(first) == HEATERS
    silent["on"] = False
    server.requests.clear()
    drv.program({1: 3, 2: 4})
    assert [r for r in server.requests if r.startswith("SOUR") and "?" not in r] == first
    server.requests.clear()
    drv.program({1: 3, 2: 4})  # now known to be set: nothing to write
    assert [r for r in server.requests if r.startswith("SOUR") and "?" not in r] == []


def test_a_lost_acknowledgement_makes_the_next_program_resend(device):
    # Qontrol: the first set's "OK" never comes (it may still have been applied).
    lost = {"on": True}
    drv, server = device("qontrol-mesh", {})
    healthy = scripted(QONTROL_HEALTHY)
    server.reply = lambda request: None if "=" in request and lost["on"] else healthy(request)
    calibrated(drv)
    with pytest.raises(DeviceTimeout):
        drv.program({1: 3, 2: 4})
    lost["on"] = False
    server.requests.clear()
    drv.program({1: 3, 2: 4})
    assert len([r for r in server.requests if "=" in r]) == HEATERS
