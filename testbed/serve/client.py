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
from urllib.parse import quote, urlencode

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

    def plan(self, body: dict) -> dict:
        """The server's plan of a playbook, drawn as `testbed plan` draws it: {"text", "inventory", "emulate"}."""
        return self.request("POST", "/plan", body)

    def catalog_runs(self, filters: dict[str, str | list[str] | None], reindex: bool = False) -> dict:
        """The runs of the server's results folder, filtered as `testbed runs` filters (a list: the filter repeated)."""
        query = [(k, v) for k, vs in filters.items() if vs is not None for v in ([vs] if isinstance(vs, str) else vs)]
        query += [("reindex", "1")] if reindex else []
        return self.request("GET", "/catalog/runs" + ("?" + urlencode(query) if query else ""))

    def result(self, run: str) -> dict:
        """The folder of a run (an id or a unique start) in the server's results folder: {"run_dir", "results"}."""
        return self.request("GET", f"/results/{quote(run, safe='')}")

    def write_report(self, run: str, html: bool, figures: bool) -> dict:
        """The server's account draws the run's figures (and its report.html): {"run_dir", "figures", "html"}."""
        return self.request("POST", f"/results/{quote(run, safe='')}/report", {"html": html, "figures": figures})

    def leases(self) -> dict:
        """The leases the server holds, as whom ({"user", "host", "pid"}), and the run under way."""
        return self.request("GET", "/leases")

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


def find_servers() -> list[Path]:
    """Every server answering in the folders a client looks in (identity.serve_dirs), in their order, each folder's
    sockets by name: the servers of this control host's labs (and their twins) that this account may reach.
    """
    found = []
    for folder in serve_dirs():
        try:
            sockets = sorted(p for p in folder.glob("*.sock") if p.is_socket())
        except OSError:  # a folder this account may not look into
            continue
        found += [path for path in sockets if _answers(path)]
    return found


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


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
        if _answers(path):
            return path
    return None
