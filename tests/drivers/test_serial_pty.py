"""SerialTransport on a real pseudo-terminal: the test plays the device on the master side."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
import threading
import time
import tty

import pytest

from drivers.errors import DeviceConnectionError, DeviceTimeout
from drivers.transports import TransportSettings
from drivers.transports.serial import SerialTransport

TIMEOUT = 0.5


class PtyDevice:
    """The far end of a raw pty. `answer` maps a request line to the bytes sent back (None: silence)."""

    def __init__(self, answer) -> None:
        self.master, self._slave = os.openpty()
        tty.setraw(self._slave)  # else the line discipline echoes and rewrites CR/LF
        self.path = os.ttyname(self._slave)
        self.answer = answer
        self.requests: list[str] = []
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = b""
        while True:
            ready, _, _ = select.select([self.master, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                request = line.decode()
                self.requests.append(request)
                reply = self.answer(request)
                if reply is not None:
                    os.write(self.master, reply)

    def pending_input(self) -> int:
        """Bytes the device sent that the serial side has not read yet (FIONREAD on the slave)."""
        return struct.unpack("i", fcntl.ioctl(self._slave, termios.FIONREAD, b"\0\0\0\0"))[0]

    def stop(self) -> None:
        # Once only: closing an fd number twice could close whatever reused it (the transport's port).
        if self._stopped:
            return
        self._stopped = True
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self.master, self._slave, self._stop_r, self._stop_w):
            os.close(fd)


@pytest.fixture
def pty_device():
    devices: list[PtyDevice] = []

    def make(answer) -> PtyDevice:
        d = PtyDevice(answer)
        devices.append(d)
        return d

    yield make
    for d in devices:
        d.stop()


def transport_for(dev: PtyDevice, audit=None) -> SerialTransport:
    return SerialTransport(TransportSettings("serial", dev.path, timeout_s=TIMEOUT), "ocs-pty", audit)


def test_query_and_write_on_a_pty(pty_device, audit_log):
    dev = pty_device(lambda req: b"Polatis,N-OST-32x32,1,6.5\r\n" if req == "*IDN?" else None)
    transport = transport_for(dev, audit_log.sink)
    assert transport.query("*IDN?") == "Polatis,N-OST-32x32,1,6.5"
    transport.write(":OXC:SWIT:DISC:ALL")
    assert transport.query("*IDN?") == "Polatis,N-OST-32x32,1,6.5"
    # The write reached the device even though it answers nothing.
    assert dev.requests == ["*IDN?", ":OXC:SWIT:DISC:ALL", "*IDN?"]
    assert [r.direction for r in audit_log] == ["tx", "rx", "tx", "tx", "rx"]
    transport.close()


def test_no_reply_on_a_pty_is_a_timeout(pty_device):
    dev = pty_device(lambda req: None)
    transport = transport_for(dev)
    start = time.monotonic()
    with pytest.raises(DeviceTimeout) as info:
        transport.query("*OPC?")
    # A lower bound of the model (a timeout cannot fire before it is due, however busy the machine); that it was
    # this timeout and not a hang is the error's own word, below.
    assert time.monotonic() - start >= TIMEOUT * 0.8
    text = str(info.value)
    assert f"within {TIMEOUT * 1000:.0f} ms" in text
    assert "ocs-pty" in text and dev.path in text and "*OPC?" in text
    assert info.value.received == b""
    transport.close()


def test_partial_reply_on_a_pty_is_a_timeout_with_the_bytes(pty_device):
    dev = pty_device(lambda req: b"(@1,2),(@1")
    transport = transport_for(dev)
    with pytest.raises(DeviceTimeout) as info:
        transport.query(":OXC:SWIT:CONN:STAT?")
    assert info.value.received == b"(@1,2),(@1"
    transport.close()


def test_late_reply_on_a_pty_is_discarded(pty_device):
    release = threading.Event()
    late_sent = threading.Event()

    def answer(req: str) -> bytes:
        if req == "first?":
            release.wait(5)
            late_sent.set()
            return b"late\r\n"
        return f"answer to {req}\r\n".encode()

    dev = pty_device(answer)
    transport = transport_for(dev)
    with pytest.raises(DeviceTimeout):
        transport.query("first?")
    release.set()
    assert late_sent.wait(5)
    # pty writes reach the slave through a work queue: wait until the late bytes are really there,
    # so that the test is about discarding them and not about a race.
    deadline = time.monotonic() + 5
    while dev.pending_input() < len(b"late\r\n") and time.monotonic() < deadline:
        time.sleep(0.001)
    assert dev.pending_input() == len(b"late\r\n")
    assert transport.query("second?") == "answer to second?"
    transport.close()


def test_vanished_pty_is_a_connection_error(pty_device):
    dev = pty_device(lambda req: b"1\r\n")
    transport = transport_for(dev)
    assert transport.query("*OPC?") == "1"
    dev.stop()  # the device end goes away: the slave now reads EIO
    with pytest.raises(DeviceConnectionError) as info:
        transport.query("*OPC?")
    assert dev.path in str(info.value)
