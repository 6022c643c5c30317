"""A bare SCPI client for the tests: lines sent on a fresh TCP connection to an emulated device, no driver of ours
in between. Here in tests/ so that every test folder can import it (tests/conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

import socket


def ask(address: str, *lines: str, timeout: float = 10) -> list[str]:
    """Send `lines` to the device at `address` ("host:port"); one answer per query line (a line ending in '?')."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall("".join(line + "\n" for line in lines).encode())
        expected = sum(line.count("?") for line in lines)
        buf = b""
        while buf.count(b"\r\n") < expected:
            chunk = sock.recv(4096)
            assert chunk, f"{address} closed the connection early"
            buf += chunk
    return buf.decode().split("\r\n")[:expected]
