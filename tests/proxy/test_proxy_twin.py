"""The fault proxy between a real client stack (pyserial socket://, pyvisa-py) and a twin's OCS endpoint."""

from __future__ import annotations

import time

import pytest
import pyvisa
import serial

from emulators.proxy import FaultProxy
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess

SPEC = TwinSpec([OcsSpec("ocs1", size=8, switching_time_ms=5, jitter_ms=0.0)])


@pytest.fixture(scope="module")
def twin():
    with TwinProcess(SPEC) as tw:
        yield tw


@pytest.fixture
def proxy(loop, twin):
    host, port = twin.endpoints.devices["ocs1"]["tcp"].rsplit(":", 1)
    p = FaultProxy("ocs1", (host, int(port)), seed=5)
    loop.run(p.start())
    yield p
    loop.run(p.close())


def test_pyserial_through_latency_and_stall(loop, proxy):
    with serial.serial_for_url(f"socket://{proxy.address}", timeout=2) as port:
        port.write(b"*IDN?\n")
        assert port.readline().strip() == SPEC.devices[0].idn.encode()
        loop.call(proxy.add_toxic, "lag", "latency", "upstream", latency=80)
        t0 = time.monotonic()
        port.write(b"*IDN?\n")
        assert port.readline().strip() == SPEC.devices[0].idn.encode()
        assert time.monotonic() - t0 >= 0.080  # a lower bound of the toxic's model: load can only make it later
        loop.call(proxy.add_toxic, "stall", "timeout", "downstream", timeout=0)
        port.timeout = 0.3
        port.write(b"*IDN?\n")
        assert port.readline() == b""  # pyserial's signature of a stalled device: no exception


def test_pyvisa_sees_reset_peer_as_connection_reset(loop, proxy):
    loop.call(proxy.add_toxic, "rst", "reset_peer", "downstream", timeout=0)
    rm = pyvisa.ResourceManager("@py")
    try:
        host, port = proxy.address.rsplit(":", 1)
        inst = rm.open_resource(f"TCPIP0::{host}::{port}::SOCKET", read_termination="\n", write_termination="\n")
        try:
            with pytest.raises(ConnectionResetError):  # docs/protocols.md §6: raw, not VisaIOError
                inst.query("*IDN?")
        finally:
            inst.close()
    finally:
        rm.close()
