"""A client of `testbed serve`, for the CLI and for scripts: the standard library's http.client over the server's
Unix socket (nothing more to import in the command that submits a run). Who the client is, the server asks the
kernel; nothing here says it.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed.contracts.errors import UserError
from testbed.serve.identity import serve_dirs, socket_name


class ServerError(UserError):
    """The server refused a request: `status` is its HTTP status, the message its words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self):
        return (ServerError, (self.status, str(self)))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    def __init__(self, socket_path: str | Path, timeout: float | None = 60.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except OSError as exc:
                raise UserError(f"testbed serve at {self.socket_path} did not answer: {exc}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(data) if data else None
        except ValueError:
            answer = {"error": data.decode(errors="replace")}
        if response.status >= 400:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise ServerError(response.status, error or f"HTTP {response.status}")
        return answer

    def info(self) -> dict:
        return self.request("GET", "/info")

    def submit(self, body: dict) -> dict:
        return self.request("POST", "/runs", body)

    def runs(self) -> list[dict]:
        """Every run: the running one, the queued in order, those done, newest first."""
        return self.request("GET", "/runs")["runs"]

    def run(self, run_id: str) -> dict:
        return self.request("GET", f"/runs/{run_id}")

    def cancel(self, run_id: str) -> dict:
        return self.request("DELETE", f"/runs/{run_id}")

    def move(self, run_id: str, position: int) -> dict:
        return self.request("POST", f"/queue/{run_id}/move", {"position": position})

    def events(self, since: int = 0, run_id: str | None = None, timeout: float | None = None) -> Iterator[dict]:
        """The server's events after `since`, then as they happen (one run's, up to its end, given `run_id`).
        `timeout`: the longest wait for the next event (None: no end; a run may take hours between two events).
        """
        query = f"/events?since={since}" + (f"&run={run_id}" if run_id else "")
        conn = _UnixConnection(self.socket_path, timeout)
        try:
            try:
                conn.request("GET", query)
                response = conn.getresponse()
            except TimeoutError:
                raise
            except (OSError, http.client.HTTPException):  # the server went away (killed): no stream, no more events
                return
            if response.status >= 400:
                answer = json.loads(response.read() or b"{}")
                raise ServerError(response.status, answer.get("error") or f"HTTP {response.status}")
            data: list[str] = []
            while True:
                try:
                    line = response.readline()
                except TimeoutError:
                    raise
                except (OSError, http.client.HTTPException):  # the server went away mid-stream (killed)
                    return
                if not line:
                    return  # the server ended the stream (the run ended, or the server stopped)
                text = line.decode().rstrip("\n")
                if text.startswith("data: "):
                    data.append(text[len("data: ") :])
                elif not text and data:
                    yield json.loads("\n".join(data))
                    data = []
        finally:
            conn.close()


def find_server(inventory_file: str | Path, emulate: bool) -> Path | None:
    """The socket of a server answering for this inventory (its twin with emulate), or None. A socket nobody answers
    on (a server that was killed) is no server.
    """
    name = socket_name(inventory_file, emulate)
    for folder in serve_dirs():
        path = folder / name
        try:
            if not path.is_socket():
                continue
        except OSError:  # a folder this account may not look into
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            continue
        finally:
            probe.close()
        return path
    return None
