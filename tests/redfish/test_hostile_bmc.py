"""The BMC driver against a BMC that misbehaves on purpose (a small TLS server of this test's): it follows no
redirect to another origin or to plain HTTP, so the session's token goes nowhere else; a BMC trickling its answer
is cut at the request's deadline; a huge body is refused, not read; a timeout is reported as a timeout.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drivers.errors import DeviceProtocolError, DeviceTimeout
from drivers.redfish import RedfishBmc, RedfishSettings
from emulators.redfish.server import self_signed_certificate

TOKEN = "s3cr3t-session-token"


class Bmc(ThreadingHTTPServer):
    """A Redfish service root and session login as any BMC answers them; `systems` says how it answers
    GET /redfish/v1/Systems (the call under test).
    """

    daemon_threads = True

    def __init__(self, cert, key, systems) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.systems = systems
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, X-Auth-Token
        self.sent_bytes = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append(("GET", self.path, self.headers.get("X-Auth-Token")))
        if self.path.rstrip("/") == "/redfish/v1":
            self._json(
                200,
                {
                    "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
                    "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
                    "Systems": {"@odata.id": "/redfish/v1/Systems"},
                },
            )
        elif self.path.startswith("/redfish/v1/Systems"):
            self.server.systems(self)
        else:
            self._json(404, {})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(("POST", self.path, self.headers.get("X-Auth-Token")))
        location = "/redfish/v1/SessionService/Sessions/1"
        self._json(201, {"@odata.id": location}, {"X-Auth-Token": TOKEN, "Location": location})

    def do_DELETE(self) -> None:  # noqa: N802
        self.server.seen.append(("DELETE", self.path, self.headers.get("X-Auth-Token")))
        self._json(204, {})


class Elsewhere(ThreadingHTTPServer):
    """Whoever a redirect points at: it records every request it gets, and any token that comes with it."""

    daemon_threads = True

    def __init__(self, tls: tuple | None) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.seen: list[tuple[str, str | None]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"


class _Recorder(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append((self.path, self.headers.get("X-Auth-Token")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return self_signed_certificate(tmp_path_factory.mktemp("bmc-cert"))


def _bmc(bmc: Bmc, cert, timeout_s: float = 5.0) -> RedfishBmc:
    settings = RedfishSettings(address=bmc.url, user="admin", password="pw", ca_file=str(cert), timeout_s=timeout_s)
    return RedfishBmc(settings, "gpu01")


@pytest.mark.parametrize("plain_http", [False, True])
def test_a_redirect_elsewhere_is_not_followed_and_the_token_goes_nowhere(tls, plain_http):
    cert, key = tls
    elsewhere = Elsewhere(None if plain_http else (cert, key))
    bmc = Bmc(cert, key, lambda h: h._json(302, {}, {"Location": f"{elsewhere.url}/redfish/v1/Systems"}))
    with pytest.raises(DeviceProtocolError) as err:
        _bmc(bmc, cert).power_state()
    assert f"redirected the request to {elsewhere.url}/redfish/v1/Systems" in str(err.value)
    assert "token was not sent there" in str(err.value) and "gpu01" in str(err.value)
    assert elsewhere.seen == []  # not a request, not a token
    assert ("GET", "/redfish/v1/Systems", TOKEN) in bmc.seen  # the token went to the BMC alone
    bmc.shutdown()
    elsewhere.shutdown()


def test_a_redirect_within_the_bmc_is_followed(tls):
    cert, key = tls

    def systems(h):
        if h.path == "/redfish/v1/Systems":
            h._json(301, {}, {"Location": "/redfish/v1/Systems/"})
        elif h.path == "/redfish/v1/Systems/":
            h._json(200, {"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})
        else:
            h._json(200, {"PowerState": "On", "Actions": {}})

    bmc = Bmc(cert, key, systems)
    assert _bmc(bmc, cert).power_state() == "On"
    bmc.shutdown()


def test_a_bmc_trickling_its_answer_is_cut_at_the_request_s_deadline(tls):
    cert, key = tls

    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "100000")
        h.end_headers()
        try:
            for _ in range(100000):  # a byte at a time, each well within a socket read's timeout
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.2)  # the hostile BMC's own pace, not a wait of the test
        except OSError:
            pass

    bmc = Bmc(cert, key, trickle)
    # The whole answer's timeout ends the call, not each read's: the error says so. A client that waited per
    # read would take 100000 x 0.2 s, which pytest-timeout fails; no wall-clock bound is needed.
    with pytest.raises(DeviceTimeout, match="no whole answer within 2 s") as err:
        _bmc(bmc, cert, timeout_s=2.0).power_state()
    assert "gpu01" in str(err.value) and "GET /redfish/v1/Systems" in str(err.value)
    bmc.shutdown()


def test_a_huge_body_is_refused_not_read(tls):
    cert, key = tls
    chunk = b" " * 65536

    def huge(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(300 * 1024 * 1024))
        h.end_headers()
        try:
            for _ in range(300 * 16):
                h.wfile.write(chunk)
                h.server.sent_bytes += len(chunk)
        except OSError:
            pass

    bmc = Bmc(cert, key, huge)
    with pytest.raises(DeviceProtocolError, match="larger than 16777216 bytes"):
        _bmc(bmc, cert, timeout_s=20.0).power_state()
    deadline = time.monotonic() + 10
    while bmc.sent_bytes < 16 * 1024 * 1024 and time.monotonic() < deadline:
        time.sleep(0.01)  # the server's writer catching up with what the client read
    assert bmc.sent_bytes < 64 * 1024 * 1024  # the client stopped reading far short of 300 MB
    bmc.shutdown()


def test_a_bmc_that_never_answers_is_a_timeout_not_an_unreachable_bmc(tls):
    cert, key = tls
    hold = threading.Event()

    def silent(h):
        hold.wait(30)  # accepts the request and says nothing

    bmc = Bmc(cert, key, silent)
    with pytest.raises(DeviceTimeout) as err:
        _bmc(bmc, cert, timeout_s=1.0).power_state()
    assert "could not reach" not in str(err.value)
    hold.set()
    bmc.shutdown()


def test_a_port_where_nothing_listens_is_an_unreachable_bmc(tls):
    cert, _ = tls
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = RedfishSettings(address=f"https://127.0.0.1:{port}", user="admin", password="pw", ca_file=str(cert))
    with pytest.raises(Exception, match="could not reach the BMC"):
        RedfishBmc(settings, "gpu01").power_state()
