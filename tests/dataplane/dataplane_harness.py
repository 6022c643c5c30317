"""One twin process with two switches and a fibre map of four hosts, shared by the folder.

Hosts and cabling (host transmit -> ingress, egress -> host receive):

    gpu01:p0 -> ocs1  1 / 9        gpu01:p1 -> ocs2 1 / 5
    gpu02:p0 -> ocs1  2 / 10       gpu04:p0 -> ocs2 2 / 6
    gpu03:p0 -> ocs1  3 / 11
"""

from __future__ import annotations

import socket
import time

from emulators.spec import OcsSpec, TwinSpec

FIBRES = [
    {"host": "gpu01", "port": "p0", "switch": "ocs1", "ingress": 1, "egress": 9},
    {"host": "gpu02", "port": "p0", "switch": "ocs1", "ingress": 2, "egress": 10},
    {"host": "gpu03", "port": "p0", "switch": "ocs1", "ingress": 3, "egress": 11},
    {"host": "gpu01", "port": "p1", "switch": "ocs2", "ingress": 1, "egress": 5},
    {"host": "gpu04", "port": "p0", "switch": "ocs2", "ingress": 2, "egress": 6},
]
SPEC = TwinSpec(
    [
        OcsSpec("ocs1", size=8, switching_time_ms=5.0, jitter_ms=0.0, input_power_dbm={1: 0.0, 2: 0.0, 3: 0.0}),
        OcsSpec("ocs2", size=4, switching_time_ms=5.0, jitter_ms=0.0),
    ],
    fibres=FIBRES,
)


class Rank:
    """A plain listening socket standing in for a job rank on 127.0.0.1."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(5)
        self.port = self.listener.getsockname()[1]

    def accept(self) -> socket.socket:
        conn, _ = self.listener.accept()
        conn.settimeout(5)
        return conn

    def close(self) -> None:
        self.listener.close()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, f"closed after {len(buf)} of {n} bytes"
        buf += chunk
    return buf


def refused(relay: str, timeout: float = 5.0) -> bool:
    """Connect through a relay: True if the connection is refused or reset before any data comes back."""
    try:
        sock = socket.create_connection(address(relay), timeout=timeout)
    except (ConnectionRefusedError, ConnectionResetError):  # a reset can beat connect() returning
        return True
    with sock:
        try:
            sock.sendall(b"hello")
            return sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def wait_reset(sock: socket.socket, timeout: float = 5.0) -> float:
    """Block until the connection is reset (or closed); return how long it took."""
    t0 = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0
