"""ProxyServer: Toxiproxy's HTTP API shape, driven by a plain HTTP client, and fuzzed with garbage."""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_harness import connect, recv_until_eof, round_trip

from emulators.proxy import ProxyServer


@pytest.fixture
def api(loop):
    server = ProxyServer(seed=3)
    address = loop.run(server.start())
    yield server, address
    loop.run(server.close())


class Client:
    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=5)

    def __call__(self, method: str, path: str, body=None, raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        text = resp.read()
        return resp.status, (json.loads(text) if text else None)


def get_status(address: str, path: str) -> int:
    c = Client(address)
    try:
        return c("GET", path)[0]
    finally:
        c.conn.close()


@pytest.fixture
def client(api):
    c = Client(api[1])  # one keep-alive connection for the whole test
    yield c
    c.conn.close()


def test_proxy_routes_round_trip(client, echo):
    upstream = f"{echo.address[0]}:{echo.address[1]}"
    status, created = client("POST", "/proxies", {"name": "ocs1", "listen": "127.0.0.1:0", "upstream": upstream})
    assert status == 201
    assert created["name"] == "ocs1" and created["enabled"] is True and created["toxics"] == []
    assert created["upstream"] == upstream and created["listen"].startswith("127.0.0.1:")
    assert not created["listen"].endswith(":0")

    assert client("GET", "/proxies") == (200, {"ocs1": created})
    assert client("GET", "/proxies/ocs1") == (200, created)
    status, conflict = client("POST", "/proxies", {"name": "ocs1", "upstream": upstream})
    assert status == 409 and conflict["status"] == 409 and "already exists" in conflict["error"]

    status, down = client("POST", "/proxies/ocs1", {"enabled": False})
    assert status == 200 and down["enabled"] is False
    host, port = created["listen"].rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()
    status, up = client("PATCH", "/proxies/ocs1", {"enabled": True})
    assert status == 200 and up["enabled"] is True and up["listen"] == created["listen"]
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        assert round_trip(sock, b"through the API-made proxy\n") >= 0

    assert client("DELETE", "/proxies/ocs1") == (204, None)
    assert client("GET", "/proxies/ocs1")[0] == 404
    assert client("DELETE", "/proxies/ocs1")[0] == 404
    assert client("GET", "/proxies") == (200, {})


def test_toxic_routes_round_trip(api, client, echo):
    server, _ = api
    upstream = f"{echo.address[0]}:{echo.address[1]}"
    client("POST", "/proxies", {"name": "p", "upstream": upstream})
    toxic = {"name": "lag", "type": "latency", "stream": "upstream", "toxicity": 1, "attributes": {"latency": 100}}
    status, made = client("POST", "/proxies/p/toxics", toxic)
    assert status == 200
    assert made == {**toxic, "toxicity": 1.0, "attributes": {"latency": 100, "jitter": 0}}
    assert client("GET", "/proxies/p/toxics") == (200, [made])
    assert client("GET", "/proxies/p/toxics/lag") == (200, made)
    assert client("GET", "/proxies/p")[1]["toxics"] == [made]
    assert client("POST", "/proxies/p/toxics", toxic)[0] == 409

    status, updated = client("POST", "/proxies/p/toxics/lag", {"attributes": {"jitter": 10}})
    assert status == 200 and updated["attributes"] == {"latency": 100, "jitter": 10}

    with connect(server.proxies["p"]) as sock:
        assert round_trip(sock, b"slow\n") >= 0.090  # latency 100 - jitter 10: a lower bound, load only adds

    status, default_named = client("POST", "/proxies/p/toxics", {"type": "timeout", "attributes": {"timeout": 0}})
    assert status == 200 and default_named["name"] == "timeout_downstream"  # Toxiproxy's default name

    assert client("DELETE", "/proxies/p/toxics/lag") == (204, None)
    assert client("GET", "/proxies/p/toxics/lag")[0] == 404
    assert client("DELETE", "/proxies/p/toxics/lag")[0] == 404
    assert client("GET", "/proxies/nope/toxics")[0] == 404

    client("POST", "/proxies/p", {"enabled": False})
    assert client("POST", "/reset") == (204, None)
    status, state = client("GET", "/proxies/p")
    assert state["toxics"] == [] and state["enabled"] is True
    with connect(server.proxies["p"]) as sock:
        assert round_trip(sock, b"clean after reset\n") >= 0


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/proxies", {"name": "x", "upstream": "127.0.0.1:1", "listen": "0.0.0.0:0"}, 400, "loopback"),
        ("POST", "/proxies", {"name": "x", "upstream": "127.0.0.1:1", "listen": "10.1.2.3:0"}, 400, "loopback"),
        ("POST", "/proxies", {"name": "x", "upstream": "127.0.0.1:1", "listen": ":8080"}, 400, "needs a host"),
        ("POST", "/proxies", {"name": "x"}, 400, "upstream"),
        ("POST", "/proxies", {"upstream": "127.0.0.1:1"}, 400, "name"),
        ("POST", "/proxies", {"name": "x", "upstream": "nowhere"}, 400, "host:port"),
        (
            "POST",
            "/proxies",
            {"name": "x", "upstream": "127.0.0.1:1", "enabled": "yes"},
            400,
            "Proxy.enabled of type bool",
        ),
        ("POST", "/proxies", {"name": "x", "upstream": "127.0.0.1:1", "colour": "red"}, 400, "unknown proxy field"),
        ("POST", "/proxies", [1, 2], 400, "cannot unmarshal array into Go value of type toxiproxy.Proxy"),
        ("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"lag": 1}}, 400, "no attribute"),
        ("POST", "/proxies/p/toxics", {"type": "gremlin"}, 400, "invalid toxic type"),
        ("POST", "/proxies/p/toxics", {"type": "latency", "stream": "both"}, 400, "stream"),
        ("POST", "/proxies/p/toxics", {"type": "latency", "toxicity": 2}, 400, "toxicity"),
        ("POST", "/proxies/p/toxics", {"type": "latency", "attributes": []}, 400, "ToxicWrapper.attributes"),
        ("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency_ms": 5}}, 400, "no attribute"),
        ("POST", "/proxies/p", {"listen": "192.168.0.1:0"}, 400, "loopback"),
        ("GET", "/nowhere", None, 404, "no route"),
        ("GET", "/proxies/p/toxics/t/extra", None, 404, "no route"),
        ("GET", "/proxies/missing", None, 404, "not found"),
        ("PUT", "/proxies", None, 405, "not allowed"),
        ("GET", "/reset", None, 405, "not allowed"),
    ],
)
def test_bad_requests(client, echo, method, path, body, status, message):
    client("POST", "/proxies", {"name": "p", "upstream": f"127.0.0.1:{echo.address[1]}"})
    got, payload = client(method, path, body)
    assert got == status
    assert payload["status"] == status and message in payload["error"]
    assert client("GET", "/proxies/p")[1]["toxics"] == []  # nothing half-applied


def test_malformed_json_body_is_400(client):
    status, payload = client("POST", "/proxies", raw=b"{not json")
    assert status == 400 and "bad request body" in payload["error"]


def _raw(address: str, data: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # no more input: the server must answer or close, not wait
        try:
            return recv_until_eof(sock)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize(
    "data",
    [
        b"GET\r\n\r\n",
        b"GET /proxies HTTP/9.9\r\n\r\n",
        b"GET proxies HTTP/1.1\r\n\r\n",
        b"POST /proxies HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET /proxies HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /proxies/%ff HTTP/1.1\r\n\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_http_gets_400(api, data):
    reply = _raw(api[1], data)
    assert reply.startswith(b"HTTP/1.1 400 ") or reply.startswith(b"HTTP/1.1 404 ")
    assert b'"status": 4' in reply


def test_body_shorter_than_content_length_is_dropped_not_hung(api):
    assert _raw(api[1], b"POST /proxies HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}") == b""
    assert get_status(api[1], "/proxies") == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        st.binary(max_size=600),
        st.builds(
            lambda m, p, rest: m + b" " + p + b" HTTP/1.1\r\n" + rest,
            st.sampled_from([b"GET", b"POST", b"DELETE", b"PATCH", b"PUT", b"X"]),
            st.sampled_from([b"/proxies", b"/proxies/p", b"/proxies/p/toxics", b"/reset", b"/", b"//"]),
            st.binary(max_size=300),
        ),
    )
)
def test_random_bytes_never_crash_the_server(api, data):
    _raw(api[1], data)
    assert get_status(api[1], "/version") == 200  # still serving


def test_shared_state_with_python_api(loop, api, client, echo):
    """A proxy made over HTTP is the same object the Python API sees, and vice versa."""
    server, _ = api
    client("POST", "/proxies", {"name": "p", "upstream": f"127.0.0.1:{echo.address[1]}"})
    proxy = server.proxies["p"]
    loop.call(proxy.add_toxic, "cut", "limit_data", bytes=3)
    assert client("GET", "/proxies/p/toxics")[1][0]["name"] == "cut"
    with connect(proxy) as sock:
        sock.sendall(b"abcdef")
        assert recv_until_eof(sock) == b"abc"
