"""VisaTransport and SerialTransport against real local sockets that misbehave on purpose.

Every failure signature of docs/protocols.md §6 must end within the timeout as a typed DeviceError whose
message names the device, the address and what was sent.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
from serial.urlhandler import protocol_socket
from socket_servers import client_receive_queue, wait_until

from drivers.errors import DeviceConnectionError, DeviceError, DeviceTimeout
from drivers.transports import TransportSettings, open_transport
from drivers.transports.serial import SerialTransport
from drivers.transports.visa import VisaTransport

TIMEOUT = 0.5
DEVICE = "ocs-under-test"
QUERY = ":OXC:SWIT:CONN:STAT?"


def make(kind: str, server_or_address, audit=None):
    if kind == "visa":
        address = server_or_address if isinstance(server_or_address, str) else server_or_address.visa
        return VisaTransport(TransportSettings("visa", address, timeout_s=TIMEOUT), DEVICE, audit)
    address = server_or_address if isinstance(server_or_address, str) else server_or_address.url
    return SerialTransport(TransportSettings("serial", address, timeout_s=TIMEOUT), DEVICE, audit)


def timed(fn):
    start = time.monotonic()
    try:
        fn()
    except DeviceError as exc:
        return exc, time.monotonic() - start
    raise AssertionError("no DeviceError raised")


def assert_names_everything(exc: DeviceError, address: str) -> None:
    text = str(exc)
    assert DEVICE in text
    assert address in text
    assert QUERY in text
    assert exc.hint  # says what to change


KINDS = ["visa", "serial"]

# (server behaviour, expected error, must it wait for the timeout?)
SIGNATURES = [
    ("silent", DeviceTimeout, True),
    ("partial", DeviceTimeout, True),
    ("fin", DeviceConnectionError, False),
    ("reset", DeviceConnectionError, False),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("behaviour", "expected", "waits"), SIGNATURES)
def test_failure_signature_is_typed_and_bounded(server_factory, kind, behaviour, expected, waits):
    server = server_factory(behaviour=behaviour, reply="(@1,2),(@17,18)")
    transport = make(kind, server)
    exc, elapsed = timed(lambda: transport.query(QUERY))
    assert type(exc) is expected, exc
    # Bounded: the call ended in the typed error (a hang is pytest-timeout's to catch), and a timeout says
    # which one it waited out, so a user can raise it.
    if waits:
        assert f"within {TIMEOUT * 1000:.0f} ms" in str(exc), exc
        # A timeout cannot fire before it is due, however busy the machine: a lower bound of the model, not a
        # speed claim (the margin is the transports' own clock rounding).
        assert elapsed >= TIMEOUT * 0.8
    assert_names_everything(exc, transport.address)
    assert server.requests == [QUERY]  # it was really sent, exactly once
    transport.close()


def test_serial_timeout_carries_the_partial_bytes(server_factory):
    server = server_factory(behaviour="partial", reply="(@1,2),(@17,18)")
    transport = make("serial", server)
    with pytest.raises(DeviceTimeout) as info:
        transport.query(QUERY)
    assert info.value.received == b"(@1,2),"
    assert "(@1,2)," in str(info.value)
    assert "partial" in str(info.value)


def test_serial_silence_is_a_timeout_with_nothing_received(server_factory):
    transport = make("serial", server_factory(behaviour="silent"))
    with pytest.raises(DeviceTimeout) as info:
        transport.query(QUERY)
    assert info.value.received == b""
    assert "read_termination is '\\n'" in str(info.value)
    assert "timeout_ms" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_refused_port_is_a_connection_error(kind, closed_port):
    address = f"TCPIP0::127.0.0.1::{closed_port}::SOCKET" if kind == "visa" else f"socket://127.0.0.1:{closed_port}"
    transport = make(kind, address)
    exc, _ = timed(lambda: transport.query(QUERY))
    assert type(exc) is DeviceConnectionError  # the refusal itself, not a timeout waited out
    assert_names_everything(exc, address)
    assert "5025" in exc.hint  # points at the port to check


@pytest.mark.parametrize("kind", KINDS)
def test_write_does_not_wait_for_a_reply(server_factory, kind):
    server = server_factory(behaviour="silent")
    transport = make(kind, server)
    # A write that waited for a reply from this silent device would raise DeviceTimeout.
    transport.write(":OXC:SWIT:DISC:ALL")
    transport.write(":OXC:SWIT:CONN:ADD (@1),(@17)")
    transport.close()
    wait_until(lambda: len(server.requests) == 2)
    assert server.requests == [":OXC:SWIT:DISC:ALL", ":OXC:SWIT:CONN:ADD (@1),(@17)"]


@pytest.mark.parametrize("kind", KINDS)
def test_reply_framing_and_audit(server_factory, kind, audit_log):
    server = server_factory(reply=lambda req: f"echo {req}" if req.endswith("?") else None)
    transport = make(kind, server, audit_log.sink)
    assert transport.query("*IDN?") == "echo *IDN?"  # the device's "\r\n" is gone
    transport.write("*CLS")
    assert transport.query("*OPC?") == "echo *OPC?"
    assert [(r.direction, r.data) for r in audit_log] == [
        ("tx", "*IDN?\n"),
        ("rx", "echo *IDN?\r\n"),
        ("tx", "*CLS\n"),
        ("tx", "*OPC?\n"),
        ("rx", "echo *OPC?\r\n"),
    ]
    stamps = [r.mono_ns for r in audit_log]
    assert stamps == sorted(stamps)
    assert {(r.device, r.address) for r in audit_log} == {(DEVICE, transport.address)}
    assert server.connections == 1  # one connection reused for all calls
    transport.close()


@pytest.mark.parametrize("kind", KINDS)
def test_reconnects_when_the_device_comes_back(server_factory, kind):
    first = server_factory(reply="first")
    transport = make(kind, first)
    assert transport.query(QUERY) == "first"
    first.stop()
    with pytest.raises(DeviceConnectionError):
        transport.query(QUERY)  # the device went away: a typed error, not a raw OSError
    second = server_factory(reply="second", port=first.port)
    assert transport.query(QUERY) == "second"
    assert second.connections == 1


@pytest.mark.parametrize("kind", KINDS)
def test_reconnects_after_a_reset(server_factory, kind):
    server = server_factory(behaviour="reset")
    transport = make(kind, server)
    with pytest.raises(DeviceConnectionError):
        transport.query(QUERY)
    server.behaviour = "reply"
    server.reply = "back"
    assert transport.query(QUERY) == "back"
    assert server.connections == 2


@pytest.mark.parametrize("kind", KINDS)
def test_late_reply_is_not_taken_as_the_next_answer(server_factory, kind):
    release = threading.Event()
    late = "late answer to first?"

    def reply(request: str) -> str:
        if request == "first?":
            release.wait(5)  # answer only after the client has given up on this query
            return late
        return f"answer to {request}"

    server = server_factory(reply=reply)
    transport = make(kind, server)
    with pytest.raises(DeviceTimeout):
        transport.query("first?")
    release.set()
    assert wait_until(lambda: late in server.sent)
    if kind == "serial":
        # Same connection: the late line must be sitting in the client's socket before the next query,
        # or this would test a race instead of the discarding.
        assert wait_until(lambda: client_receive_queue(server) == len(late) + 2)
    assert transport.query("second?") == "answer to second?"
    # VISA gets there by dropping the timed-out session; serial by discarding stale input.
    assert server.connections == (2 if kind == "visa" else 1)
    transport.close()


def test_open_transport_chooses_by_type():
    visa = open_transport(TransportSettings("visa", "TCPIP0::127.0.0.1::5025::SOCKET"), "a")
    serial = open_transport(TransportSettings("serial", "/dev/ttyUSB0"), "b")
    assert isinstance(visa, VisaTransport)
    assert isinstance(serial, SerialTransport)
    with pytest.raises(ValueError, match="'visa'.*'serial'"):
        open_transport(TransportSettings("ssh", "host"), "c")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "address",
    ["TCPIP0::127.0.0.1::SOCKET", "not a resource", "GPIB0::xx::INSTR"],
)
def test_malformed_visa_resource_says_what_the_format_is(address):
    transport = VisaTransport(TransportSettings("visa", address, timeout_s=TIMEOUT), DEVICE)
    with pytest.raises(DeviceConnectionError) as info:
        transport.query(QUERY)
    assert "TCPIP0::10.0.0.5::5025::SOCKET" in info.value.hint
    assert address in str(info.value)


@pytest.mark.parametrize(
    ("kind", "address"),
    [("visa", "ASRL/dev/does-not-exist::INSTR"), ("serial", "/dev/does-not-exist")],
)
def test_missing_serial_device_is_a_connection_error(kind, address):
    transport = make(kind, address)
    with pytest.raises(DeviceConnectionError) as info:
        transport.query(QUERY)
    assert "dialout" in info.value.hint
    assert "/dev/does-not-exist" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_read_termination_is_refused(kind):
    with pytest.raises(ValueError, match="read_termination"):
        TransportSettings(kind, "x", read_termination="")


@pytest.mark.parametrize("kind", KINDS)
def test_close_then_reopen_on_next_call(server_factory, kind):
    # pyserial's own socket:// close() sleeps 0.3 s; a reconnect must not pay that on every failover.
    transport = make(kind, server_factory(reply="1"))
    assert transport.query("*OPC?") == "1"
    transport.close()
    assert transport.query("*OPC?") == "1"  # it reopens on the next call
    transport.close()


@pytest.mark.parametrize("kind", KINDS)
def test_write_then_query_is_not_held_back_by_nagle(server_factory, kind):
    # A set-command then :SYST:ERR? are two small segments; with Nagle on, the second waits for a
    # delayed ACK (~40 ms on Linux) on every checked write. Loopback round trips take well under 1 ms.
    # (How much it costs is measured in bench/ocs_overhead.py; here: the option is on the live socket.)
    server = server_factory(reply=lambda req: '0,"No error"' if req.endswith("?") else None)
    transport = make(kind, server)
    transport.write(":OXC:SWIT:CONN:ADD (@1),(@17)")
    assert transport.query(":SYST:ERR?") == '0,"No error"'
    if kind == "visa":
        sock = VisaTransport._socket(transport._res)
    else:
        sock = transport._port._socket
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    transport.close()


def test_serial_socket_port_never_sleeps_on_close(server_factory, monkeypatch):
    # pyserial's socket:// close() ends in time.sleep(0.3), and io.IOBase.__del__ calls close(): a port
    # left unclosed (here: dropped with its transport) was freed by the cyclic garbage collector in
    # whatever thread triggered it, e.g. a ScriptedServer accept thread, which then started serving a
    # new connection only after the client's timeout.
    sleeps: list[float] = []
    monkeypatch.setattr(protocol_socket, "time", SimpleNamespace(sleep=sleeps.append))
    server = server_factory(reply="1")

    closed = make("serial", server)
    assert closed.query("*OPC?") == "1"
    closed.close()

    dropped = make("serial", server)
    assert dropped.query("*OPC?") == "1"
    port = weakref.ref(dropped._port)
    sock = dropped._port._socket
    del dropped
    gc.collect()
    assert port() is None  # finalized, as the collector would at some arbitrary point
    assert sock.fileno() == -1  # and its socket closed by that

    assert sleeps == []
