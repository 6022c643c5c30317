"""Fixtures for the data-plane tests: one twin process (dataplane_harness.SPEC) shared by the folder."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from dataplane_harness import SPEC, Rank

from emulators.control import TwinControl
from emulators.twin import TwinProcess


@pytest.fixture(scope="session")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(SPEC) as tw:
        yield tw


@pytest.fixture
def ctl(twin: TwinProcess) -> Iterator[TwinControl]:
    """The control API, with the switches and the data plane reset before and after each test."""
    control = twin.control

    def reset() -> None:
        control.call(None, "dataplane.reset")
        control.call("ocs1", "reset")
        control.call("ocs2", "reset")

    reset()
    yield control
    reset()


@pytest.fixture
def scpi(twin: TwinProcess):
    """scpi(device, *lines) -> the answers to the query lines, on a fresh connection to the device."""

    def run(device: str, *lines: str) -> list[str]:
        host, port = twin.endpoints.devices[device]["tcp"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall("".join(line + "\n" for line in lines).encode())
            expected = sum(line.count("?") for line in lines)
            buf = b""
            while buf.count(b"\r\n") < expected:
                chunk = sock.recv(4096)
                assert chunk, "connection closed early"
                buf += chunk
        return buf.decode().split("\r\n")[:expected]

    return run


@pytest.fixture
def rank() -> Iterator[Rank]:
    r = Rank()
    yield r
    r.close()
