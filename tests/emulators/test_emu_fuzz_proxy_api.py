"""Property tests for the fault proxy's Toxiproxy-style HTTP API (emulators/proxy/http.py) with well-formed
HTTP carrying random JSON bodies (tests/proxy/test_proxy_http.py fuzzes the HTTP framing itself): every
request gets a 2xx or a 4xx with an error message, never a 500 (a bug in a handler), and the server keeps
serving. Directly on ProxyServer.handle, and through a real HTTP connection.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from emulators.endpoints import precise_event_loop
from emulators.proxy import ProxyServer

KEYS = [
    "name", "type", "stream", "toxicity", "attributes", "listen", "upstream", "enabled", "seed", "toxics",
    "latency", "jitter", "rate", "delay", "timeout", "bytes", "average_size", "size_variation", "latency_ms",
]  # fmt: skip
VALUES = [
    "latency", "bandwidth", "slicer", "limit_data", "timeout", "reset_peer", "slow_close", "gremlins",
    "upstream", "downstream", "127.0.0.1:0", "localhost:0", "[::1]:0", "10.0.0.1:0", "127.0.0.1:99999", "p", "t",
]  # fmt: skip
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=10), st.sampled_from(VALUES)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner),
    max_leaves=12,
)
bodies = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), json_values, max_size=6)
METHODS = ["GET", "POST", "PATCH", "DELETE", "PUT"]
PATHS = ["/proxies", "/proxies/p", "/proxies/p/toxics", "/proxies/p/toxics/t", "/proxies/q", "/reset", "/version"]


class LoopThread:
    """The proxy lives on an event loop (as in the twin); the tests call it from their own thread."""

    def __init__(self) -> None:
        self.loop = precise_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[LoopThread, ProxyServer]]:
    lt = LoopThread()
    server = ProxyServer(seed=3)
    lt.run(server.start())
    yield lt, server
    lt.run(server.close())
    lt.stop()


def request(lt: LoopThread, server: ProxyServer, method: str, path: str, body: object) -> tuple[int, object]:
    return lt.run(server.handle(method, path, json.dumps(body).encode()))


def with_proxy_and_toxic(lt: LoopThread, server: ProxyServer) -> None:
    """A proxy "p" with a toxic "t", so that the routes below them are reached too."""
    if "p" not in server.proxies:
        request(lt, server, "POST", "/proxies", {"name": "p", "upstream": "127.0.0.1:9", "listen": "127.0.0.1:0"})
    request(lt, server, "POST", "/proxies/p", {"enabled": True})
    if "t" not in [t["name"] for t in server.proxies["p"].toxics()]:
        request(lt, server, "POST", "/proxies/p/toxics", {"name": "t", "type": "latency"})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(METHODS), st.sampled_from(PATHS), bodies)
@example("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"type": 1}})  # was a TypeError: 500
@example("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"name": "x", "stream": "upstream"}})
@example("POST", "/proxies/p/toxics/t", {"attributes": {"toxicity": 0.5}})
@example("POST", "/proxies/p/toxics/t", {"attributes": {"name": "u"}})
def test_random_json_bodies_never_make_a_500(api, method, path, body):
    lt, server = api
    with_proxy_and_toxic(lt, server)
    status, payload = request(lt, server, method, path, body)
    assert status < 500, payload
    if status >= 400:
        assert payload["status"] == status and payload["error"]
    json.dumps(payload)  # the answer is JSON
    assert request(lt, server, "GET", "/proxies", None)[0] == 200


def test_an_attribute_named_like_a_parameter_is_a_400_naming_it(api):
    lt, server = api
    with_proxy_and_toxic(lt, server)
    status, payload = request(lt, server, "POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"type": 1}})
    assert status == 400 and "latency toxic has no attribute 'type'" in payload["error"]
    status, payload = request(lt, server, "POST", "/proxies/p/toxics/t", {"attributes": {"toxicity": 1}})
    assert status == 400 and "no attribute 'toxicity'" in payload["error"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(METHODS), st.sampled_from(PATHS), bodies)
def test_random_json_over_real_http(api, method, path, body):
    lt, server = api
    with_proxy_and_toxic(lt, server)
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        conn.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        text = response.read()
        assert response.status < 500, text
        conn.request("GET", "/version")  # the same keep-alive connection still serves
        assert conn.getresponse().status == 200
    finally:
        conn.close()
