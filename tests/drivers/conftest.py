"""Fixtures for the driver tests: real local endpoints, an audit sink that keeps its records."""

from __future__ import annotations

import socket

import pytest
from socket_servers import ScriptedServer


@pytest.fixture
def server_factory():
    servers: list[ScriptedServer] = []

    def make(**kwargs) -> ScriptedServer:
        s = ScriptedServer(**kwargs)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def audit_log():
    """An AuditSink that keeps the records; `audit_log.sink` goes to the transport."""

    class Log(list):
        def sink(self, rec) -> None:
            self.append(rec)

    return Log()
