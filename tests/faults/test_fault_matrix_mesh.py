"""Driver x fault matrix for the photonic chip: scpi-mesh over VISA TCP through the fault proxy, and
qontrol-mesh over the Qontrol serial line (a pty) with the emulator's serial-line faults.

Each operation runs the way a run executes it: a real procedure in the runner's DeviceActor (used
in-process, without Ray), which records every call as ok, fail or info (outcome unknown: something was
sent, then the transport failed). What a user relies on, per fault kind and operation:

- never a hang: each call ends, in success or a typed error, and a timeout names the transport timeout it
  waited out (a call that never ends is pytest-timeout's to fail: no wall-clock bound here);
- success, or a typed DeviceError: never a raw socket / pyvisa / pyserial / numpy exception;
- the history's status: "info" when a command went out and the transport then failed (a program whose
  acknowledgement was lost: LANDED says whether the chip's heaters did change), "fail" when the call
  certainly did not happen (nothing was sent) or the device answered garbage;
- recovery by itself: once the fault is healed the same actor (same driver object) identifies the chip
  and programs it, and reading the heaters back gives the circuits asked for.

The fault hits a live session (the actor has just programmed the chip), and each faulted operation is
run twice: the first call meets the session the fault found, the second whatever the transport
reconnected to. EXPECTED is the observed behaviour, made explicit per fault.

A pty cannot sit behind the TCP proxy, so the serial line's faults are the emulator's own (control op
serial_fault, see emulators/mesh/device.py): latency and slicer (slow or trickling replies), stall (the
reply is lost, the command was executed), truncate, garbage, and gone (the pty closed, like a USB
adapter pulled out; it comes back under the same stable link). The proxy's bandwidth, slow_close and
reset_peer have no serial-line counterpart: a pty has no line rate (termios speed is ignored), and a
serial line has no connection to close or reset, only the cable to pull (gone).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fault_harness import PROXY_FAULTS, TYPED, inject_proxy_fault, make_actor, names_timeout, wait_until

from drivers.transports import TransportSettings
from emulators.control import TwinControlError
from emulators.mesh.spec import MeshSpec
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess

DEVICE = "chip1"
CHIP = MeshSpec(DEVICE, size=2, seed=3, input_power_dbm={1: 0.0, 2: 0.0})
TIMEOUT = 0.3  # transport timeout, s
BAR = [(1, 3), (2, 4)]  # the circuits programmed before the fault
CROSS = [(1, 4), (2, 3)]  # the circuits the faulted operation asks for
PORTS = [1, 2, 3, 4]

SERIAL_FAULTS: dict[str, tuple[str, float]] = {
    "latency_above": ("latency", TIMEOUT * 3 * 1000),  # every reply late by 3 timeouts
    "latency_below": ("latency", TIMEOUT / 4 * 1000),  # late, within the timeout
    "slicer": ("slicer", 2.0),  # replies trickle out 3 bytes every 2 ms
    "stall": ("stall", 0.0),  # the command is executed, its reply lost
    "truncate": ("truncate", 0.0),  # half of the reply, no terminator
    "garbage": ("garbage", 0.0),  # a line of non-protocol bytes
    "gone": ("gone", 0.0),  # the pty closed
}

OK, INFO, FAIL = "ok", "info", "fail"
TMO, CONN, PROTO = "DeviceTimeout", "DeviceConnectionError", "DeviceProtocolError"
LANDED, NOT_LANDED = True, False

# (driver, fault, operation) -> ((status, error type) of each of the two faulted calls, did the heaters change)
# "identify" = mesh.identify (queries only); "reconfigure" = mesh.reconfigure from BAR to CROSS (heater sets,
# then for SCPI *OPC? and :SYST:ERR?, then every heater read back; after a failure the procedure forgets the
# circuits it cached, so the second call reads the heaters first).
# Timing (observed, not asserted): TMO takes the full timeout, CONN is immediate.
Outcome = tuple[tuple[tuple[str, str | None], ...], bool | None]
EXPECTED: dict[tuple[str, str, str], Outcome] = {
    # driver       fault            operation        the two faulted calls            landed
    ("scpi-mesh", "latency_above", "identify"): (((INFO, TMO), (INFO, TMO)), None),
    ("scpi-mesh", "latency_above", "reconfigure"): (((INFO, TMO), (INFO, TMO)), LANDED),  # *OPC? answer late
    ("scpi-mesh", "latency_below", "identify"): (((OK, None), (OK, None)), None),
    ("scpi-mesh", "latency_below", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    ("scpi-mesh", "bandwidth", "identify"): (((OK, None), (OK, None)), None),
    ("scpi-mesh", "bandwidth", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    # The source never closes its session: there is no close for slow_close to delay.
    ("scpi-mesh", "slow_close", "identify"): (((OK, None), (OK, None)), None),
    ("scpi-mesh", "slow_close", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    ("scpi-mesh", "timeout", "identify"): (((INFO, TMO), (INFO, TMO)), None),
    ("scpi-mesh", "timeout", "reconfigure"): (((INFO, TMO), (INFO, TMO)), LANDED),  # sets went out, no *OPC?
    ("scpi-mesh", "reset_peer", "identify"): (((INFO, CONN), (INFO, CONN)), None),
    ("scpi-mesh", "reset_peer", "reconfigure"): (((INFO, CONN), (INFO, CONN)), LANDED),  # reset on *OPC?'s answer
    ("scpi-mesh", "slicer", "identify"): (((OK, None), (OK, None)), None),
    ("scpi-mesh", "slicer", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    ("scpi-mesh", "limit_data", "identify"): (((INFO, CONN), (INFO, CONN)), None),
    ("scpi-mesh", "limit_data", "reconfigure"): (((INFO, CONN), (INFO, CONN)), LANDED),
    # Nothing reaches the source, yet "info": the VISA transport audits a command before pyvisa-py reports
    # the refused connection (its connect is non-blocking). Unknown rather than fail: cautious, not wrong.
    ("scpi-mesh", "down", "identify"): (((INFO, CONN), (INFO, CONN)), None),
    ("scpi-mesh", "down", "reconfigure"): (((INFO, CONN), (INFO, CONN)), NOT_LANDED),
    ("qontrol-mesh", "latency_above", "identify"): (((INFO, TMO), (INFO, TMO)), None),
    ("qontrol-mesh", "latency_above", "reconfigure"): (((INFO, TMO), (INFO, TMO)), LANDED),  # first set's OK late
    ("qontrol-mesh", "latency_below", "identify"): (((OK, None), (OK, None)), None),
    ("qontrol-mesh", "latency_below", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    ("qontrol-mesh", "slicer", "identify"): (((OK, None), (OK, None)), None),
    ("qontrol-mesh", "slicer", "reconfigure"): (((OK, None), (OK, None)), LANDED),
    ("qontrol-mesh", "stall", "identify"): (((INFO, TMO), (INFO, TMO)), None),
    ("qontrol-mesh", "stall", "reconfigure"): (((INFO, TMO), (INFO, TMO)), LANDED),  # the acknowledgement is lost
    ("qontrol-mesh", "truncate", "identify"): (((INFO, TMO), (INFO, TMO)), None),
    ("qontrol-mesh", "truncate", "reconfigure"): (((INFO, TMO), (INFO, TMO)), LANDED),
    # A garbled reply after something was sent: the outcome is unknown (Jepsen's info), query or not.
    ("qontrol-mesh", "garbage", "identify"): (((INFO, PROTO), (INFO, PROTO)), None),
    # The set landed and its acknowledgement is garbage: info, and indeed it landed.
    ("qontrol-mesh", "garbage", "reconfigure"): (((INFO, PROTO), (INFO, PROTO)), LANDED),
    # The line is found dead (EIO) before anything is written, then the path is missing: certainly failed.
    ("qontrol-mesh", "gone", "identify"): (((FAIL, CONN), (FAIL, CONN)), None),
    ("qontrol-mesh", "gone", "reconfigure"): (((FAIL, CONN), (FAIL, CONN)), NOT_LANDED),
}

DRIVERS = {"scpi-mesh": PROXY_FAULTS, "qontrol-mesh": list(SERIAL_FAULTS)}
OPERATIONS = ["identify", "reconfigure"]
CASES = [(d, f, o) for d, faults in DRIVERS.items() for f in faults for o in OPERATIONS]


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(TwinSpec([CHIP], fault_proxy=True)) as tw:
        yield tw


@pytest.fixture(scope="module")
def calibration(twin: TwinProcess, tmp_path_factory) -> str:
    """The chip's calibration, swept once over the SCPI source's own endpoint (no proxy)."""
    path = str(tmp_path_factory.mktemp("mesh") / "chip1.json")
    host, port = twin.endpoints.devices[DEVICE]["tcp_direct"].rsplit(":", 1)
    actor = make_actor(DEVICE, "scpi-mesh", TransportSettings("visa", f"TCPIP0::{host}::{port}::SOCKET"))
    try:
        result = actor.run("mesh.calibrate", {"path": path, "points": 24})
        assert result.status == OK, result.error
    finally:
        actor.close()
    return path


@pytest.fixture
def ctl(twin: TwinProcess):
    """The twin's control API, with the proxy and the serial line healed and the chip reset around each test."""
    control = twin.control
    control.call(None, "proxy.reset")
    control.call(DEVICE, "reset")
    yield control
    control.call(None, "proxy.reset")
    control.call(DEVICE, "reset")


def settings(twin: TwinProcess, driver: str) -> TransportSettings:
    ends = twin.endpoints.devices[DEVICE]
    if driver == "scpi-mesh":
        return TransportSettings("visa", ends["visa"], timeout_s=TIMEOUT)
    # The stable link, not /dev/pts/N: a pty that comes back after "gone" has another number.
    return TransportSettings("serial", ends["qontrol_link"], timeout_s=TIMEOUT, baudrate=115200)


def inject(ctl, driver: str, fault: str) -> None:
    if driver == "scpi-mesh":
        inject_proxy_fault(ctl, DEVICE, fault, TIMEOUT)
    else:
        kind, delay_ms = SERIAL_FAULTS[fault]
        ctl.call(DEVICE, "serial_fault", kind=kind, delay_ms=delay_ms)


def heal(ctl, driver: str) -> None:
    if driver == "scpi-mesh":
        ctl.call(DEVICE, "proxy.reset")
        return
    # The device is back once it has sent the replies it still owed (a slow module answers in order). A
    # serial line has no connection to drop them with: the serial transport flushes its input before each
    # query, which discards replies that came before it, but one that comes later would be read as the
    # answer to that query. Nothing on the line can tell them apart (the protocol has no request ids).
    assert wait_until(lambda: ctl.call(DEVICE, "serial_heal")["replies_pending"] == 0)


def operation(op: str) -> tuple[str, dict]:
    if op == "identify":
        return "mesh.identify", {"expected_size": CHIP.size}
    return "mesh.reconfigure", {"circuits": CROSS, "managed": PORTS, "verify_light": False}


def heater_power(ctl) -> list[float]:
    return ctl.call(DEVICE, "state")["power_mw"]


def test_the_table_covers_every_combination():
    assert set(EXPECTED) == set(CASES)


def test_serial_fault_ops(twin, ctl):
    ends = twin.endpoints.devices[DEVICE]
    assert os.path.realpath(ends["qontrol_link"]) == ends["qontrol"]
    with pytest.raises(TwinControlError, match="unknown serial fault 'gremlins'.*latency.*gone"):
        ctl.call(DEVICE, "serial_fault", kind="gremlins")
    with pytest.raises(TwinControlError, match="delay_ms must be a number >= 0"):
        ctl.call(DEVICE, "serial_fault", kind="latency", delay_ms=-1)
    ctl.call(DEVICE, "serial_fault", kind="gone")
    assert not os.path.exists(ends["qontrol_link"])  # the link dangles while the adapter is out
    back = ctl.call(DEVICE, "serial_heal")
    assert back["qontrol_link"] == ends["qontrol_link"] and back["replies_pending"] == 0
    assert os.path.realpath(ends["qontrol_link"]) == back["qontrol"] and os.path.exists(back["qontrol"])


@pytest.mark.parametrize(("driver", "fault", "op"), CASES)
def test_fault(twin, ctl, calibration, driver, fault, op):
    actor = make_actor(DEVICE, driver, settings(twin, driver))
    try:
        # A live session, a calibrated driver and BAR on the chip (the actor caches the circuits it holds).
        for procedure, kwargs in [
            ("mesh.calibrate", {"path": calibration, "reuse": True}),
            ("mesh.reconfigure", {"circuits": BAR, "managed": PORTS, "verify_light": False}),
        ]:
            result = actor.run(procedure, kwargs)
            assert result.status == OK, result.error
        before = heater_power(ctl)
        inject(ctl, driver, fault)

        seen = []
        for _ in range(2):
            result = actor.run(*operation(op))
            if result.status != OK:
                # Typed, and telling the user which device and what to try.
                assert result.error_type in TYPED, result.error
                assert DEVICE in result.error and "try:" in result.error, result.error
            if result.error_type == "DeviceTimeout":
                assert names_timeout(result.error, TIMEOUT), result.error
            seen.append((result.status, result.error_type))
        heal(ctl, driver)
        landed = heater_power(ctl) != before if op == "reconfigure" else None
        observed = (tuple(seen), landed)
        assert observed == EXPECTED[(driver, fault, op)]

        # Recovery with the same actor and driver object; reconfigure reads the heaters back and checks them.
        for procedure, kwargs in [
            ("mesh.identify", {"expected_size": CHIP.size}),
            ("mesh.reconfigure", {"circuits": CROSS, "managed": PORTS, "verify_light": False}),
        ]:
            result = actor.run(procedure, kwargs)
            assert result.status == OK, result.error
    finally:
        actor.close()
