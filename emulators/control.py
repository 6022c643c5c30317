"""Client for the twin's control server: JSON lines over TCP (see emulators/twin.py for the server).

    request   {"device": "ocs1", "op": "fail_port", "args": {"port": 3}}
    response  {"ok": true, "result": null}  or  {"ok": false, "error": "..."}

    timed     {"device": "gpu03", "op": "fail_gpu", "args": {...}, "at_ns": T}: run at CLOCK_MONOTONIC T
    missed    {"ok": false, "missed": true, "error": "..."}: T had passed on arrival; nothing applied

Twin-wide ops use "device": null ("ping", "endpoints"). Every device op is idempotent (fail a port,
set a power, reset, read state), so a call that hits a dropped connection is retried once.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any


class TwinControlError(RuntimeError):
    """The twin refused a control request, or could not be reached."""


class TriggerMissed(TwinControlError):
    """A timed request reached the twin after its moment: nothing was applied; schedule it further ahead."""


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address
    host, _, port = address.rpartition(":")
    return host, int(port)


class TwinControl:
    """A persistent, thread-safe connection to one twin's control server."""

    def __init__(self, address: str | tuple[str, int], timeout: float = 10.0):
        self.address = parse_address(address)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buf = b""

    def call(self, device: str | None, op: str, **args: Any) -> Any:
        """Run `op` on `device` (None for twin-wide ops) and return its result."""
        return self._request({"device": device, "op": op, "args": args})

    def call_at(self, at_ns: int, device: str, op: str, **args: Any) -> Any:
        """Run `op` on `device` at CLOCK_MONOTONIC at_ns (the twin shares this machine's clock) and return its
        result once it has run. Raises TriggerMissed if the request reached the twin too late.
        """
        return self._request({"device": device, "op": op, "args": args, "at_ns": int(at_ns)})

    def _request(self, payload: dict[str, Any]) -> Any:
        device, op = payload["device"], payload["op"]
        request = (json.dumps(payload) + "\n").encode()
        with self._lock:
            try:
                line = self._exchange(request)
            except (OSError, EOFError):
                self._disconnect()
                try:
                    line = self._exchange(request)
                except (OSError, EOFError) as exc:
                    self._disconnect()
                    raise TwinControlError(
                        f"twin control server {self.address[0]}:{self.address[1]} unreachable "
                        f"during {op!r} on {device!r}: {exc!r}"
                    ) from exc
        response = json.loads(line)
        if not response.get("ok"):
            kind = TriggerMissed if response.get("missed") else TwinControlError
            raise kind(f"{op!r} on {device!r}: {response.get('error')}")
        return response.get("result")

    def ping(self) -> bool:
        return self.call(None, "ping") == "pong"

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    def __enter__(self) -> TwinControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _exchange(self, request: bytes) -> bytes:
        if self._sock is None:
            self._sock = socket.create_connection(self.address, timeout=self.timeout)
            self._buf = b""
        self._sock.sendall(request)
        while b"\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("control connection closed by the twin")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""
