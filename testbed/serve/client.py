"""A client of `testbed serve`, for the CLI and for scripts: the standard library's http.client over the server's
Unix socket (nothing more to import in the command that submits a run). Who the client is, the server asks the
kernel; nothing here says it. RemoteClient is the same over HTTPS to a server's remote listener (`testbed serve
--remote`), where a token says who the client is.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import urllib.parse
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

    @property
    def address(self) -> str:
        """Where the server is, as its messages say it."""
        return str(self.socket_path)

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        return _UnixConnection(self.socket_path, timeout)

    def _headers(self) -> dict[str, str]:
        return {}  # the kernel says who this client is

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        conn = self._connection(self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = self._headers() | ({"Content-Type": "application/json"} if payload is not None else {})
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except OSError as exc:
                raise UserError(f"testbed serve at {self.address} did not answer: {exc}") from None
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
        conn = self._connection(timeout)
        try:
            try:
                conn.request("GET", query, headers=self._headers())
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


TOKEN_ENV = "TESTBED_TOKEN"  # noqa: S105 - the variable's name, not a token
MAX_TOKEN_BYTES = 4096  # a token is 43 characters; a larger file is not one
SERVER_ENV = "TESTBED_SERVER"


class RemoteClient(Client):
    """A client of a server's remote listener (`testbed serve --remote`): HTTPS, the server's certificate verified
    against the system's CAs or `ca` (a lab's own CA), and the user's token in each request's Authorization header.
    The token is kept out of every message and of repr().
    """

    def __init__(self, url: str, token: str, ca: str | Path | None = None, timeout: float | None = 60.0) -> None:
        self.host, self.port = self.parse(url)
        self.url = f"https://{self.host}:{self.port}" if ":" not in self.host else f"https://[{self.host}]:{self.port}"
        self.timeout = timeout
        self.__token = token
        try:
            self.context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(f"--ca {ca}: not a file of CA certificates: {exc}") from None
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2

    @staticmethod
    def parse(url: str) -> tuple[str, int]:
        """(host, port) of a server's URL, https://HOST[:PORT]; UserError for anything else."""
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port or 443
        except ValueError:
            port = -1
        if parsed.scheme != "https" or not parsed.hostname or port < 0 or parsed.path not in ("", "/"):
            raise UserError(f"{url}: give the server as https://HOST:PORT (testbed serve --remote)")
        return parsed.hostname, port

    def __repr__(self) -> str:
        return f"RemoteClient({self.url!r})"

    @property
    def address(self) -> str:
        return self.url

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.__token}"}

    def request(self, method: str, path: str, body: dict | None = None) -> Any:
        try:
            return super().request(method, path, body)
        except ServerError as exc:
            raise self._said(exc) from None
        except UserError as exc:
            cause = exc.__context__
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise UserError(
                    f"testbed serve at {self.url}: its certificate does not verify ({cause.verify_message}); "
                    "give the lab's CA with --ca FILE"
                ) from None
            raise

    def events(self, since: int = 0, run_id: str | None = None, timeout: float | None = None) -> Iterator[dict]:
        try:
            yield from super().events(since, run_id, timeout)
        except ServerError as exc:
            raise self._said(exc) from None

    def _said(self, exc: ServerError) -> ServerError:
        if exc.status != 401:
            return exc
        return ServerError(
            401,
            f"testbed serve at {self.url} refused the token (401): set {TOKEN_ENV} or ~/.config/testbed/token to the "
            "one `testbed token new` printed for you",
        )


def token_file() -> Path:
    return Path.home() / ".config" / "testbed" / "token"


def load_token() -> str:
    """The user's token: $TESTBED_TOKEN, else ~/.config/testbed/token, a file of this account's only it may read."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given
    from testbed.events.safe_files import UnsafeFile, read_private  # only a remote client reads a token file

    path = token_file()
    try:
        token = read_private(path, MAX_TOKEN_BYTES).decode("utf-8").strip()
    except FileNotFoundError:
        raise UserError(f"a remote server needs your token: set {TOKEN_ENV}, or put it in {path} (mode 600)") from None
    except UnsafeFile as exc:
        raise UserError(f"{exc} (your token: a secret)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read your token: {exc}") from None
    if not token:
        raise UserError(f"{path}: empty; put your token there")
    return token
