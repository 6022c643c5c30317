"""FaultProxy against real sockets: each toxic as a driver would experience it.

Timing assertions are lower bounds only (a reply never arrives before the fault allows it); a
busy CI machine can only make things later, never earlier.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
from proxy_harness import connect, recv_exactly, recv_until_eof, round_trip


def test_pass_through_multi_kb(make_proxy):
    proxy = make_proxy()
    payload = os.urandom(200_000)
    with connect(proxy) as sock:
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        for i in range(20):  # many small request/reply exchanges on one connection
            assert round_trip(sock, f"*IDN? {i}\n".encode()) >= 0
        sock.shutdown(socket.SHUT_WR)  # half-close reaches the server, whose close comes back
        assert recv_until_eof(sock) == b""


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_delays_every_reply(loop, make_proxy, stream):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "lat", "latency", stream, latency=120)
    with connect(proxy) as sock:
        for _ in range(3):
            assert round_trip(sock, b"ping\n") >= 0.120


def test_latency_applies_to_open_connections_and_is_removable(loop, make_proxy):
    proxy = make_proxy()
    with connect(proxy) as sock:
        round_trip(sock, b"warm\n")
        loop.call(proxy.add_toxic, "lat", "latency", latency_ms=100)  # alias spelling
        assert round_trip(sock, b"slow\n") >= 0.100
        loop.call(proxy.remove_toxic, "lat")
        assert round_trip(sock, b"fast again\n") >= 0  # no longer held back: completes


def _jitter_run(loop, make_proxy, seed):
    proxy = make_proxy(seed=seed)
    loop.call(proxy.add_toxic, "jit", "latency", latency=40, jitter=30)
    observed = []
    with connect(proxy) as sock:
        for i in range(5):
            observed.append(round_trip(sock, f"m{i}\n".encode()))
    conns = loop.call(proxy.connections)
    drawn = conns[0]["latency_ms"]["jit"][:5]
    return drawn, observed


def test_jitter_is_repeatable_per_seed(loop, make_proxy):
    drawn1, observed1 = _jitter_run(loop, make_proxy, seed=42)
    drawn2, observed2 = _jitter_run(loop, make_proxy, seed=42)
    drawn3, _ = _jitter_run(loop, make_proxy, seed=43)
    assert len(drawn1) == 5 and drawn1 == drawn2
    assert drawn1 != drawn3
    assert len(set(drawn1)) > 1 and all(10 <= d <= 70 for d in drawn1)
    for d, obs in zip(drawn1 + drawn2, observed1 + observed2, strict=True):
        assert obs >= d / 1000  # each reply really was held for its drawn delay


def test_bandwidth_limits_throughput(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "bw", "bandwidth", "downstream", rate=100)  # 100 KB/s
    payload = os.urandom(30_000)
    with connect(proxy) as sock:
        assert round_trip(sock, payload) >= 0.3 * 0.99  # 30 kB at 100 kB/s (float slack only)


def test_timeout_zero_holds_data_while_upstream_lives(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "stall", "timeout", "downstream", timeout=0)
    with connect(proxy) as sock:
        sock.sendall(b"anyone there?\n")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        loop.call(proxy.remove_toxic, "stall")  # data sent during the stall was dropped, as in Toxiproxy
        sock.settimeout(5)
        assert round_trip(sock, b"back\n") >= 0


def test_timeout_closes_after_the_delay(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "to", "timeout", "upstream", timeout=200)
    t0 = time.monotonic()
    with connect(proxy) as sock:
        sock.sendall(b"lost\n")
        assert recv_until_eof(sock) == b""  # no data, then a clean close
        assert time.monotonic() - t0 >= 0.200


def test_reset_peer_sends_rst(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "rst", "reset_peer", "downstream", timeout=0)
    with connect(proxy) as sock:
        sock.sendall(b"*IDN?\n")
        with pytest.raises(ConnectionResetError):
            recv_until_eof(sock)


def test_reset_peer_waits_its_timeout(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "rst", "reset_peer", "upstream", timeout=150)
    with connect(proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"*IDN?\n")  # the first data arms it
        with pytest.raises(ConnectionResetError):
            recv_until_eof(sock)
        assert time.monotonic() - t0 >= 0.150


def test_slicer_splits_into_several_reads(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "sl", "slicer", "downstream", average_size=100, size_variation=30, delay=3000)
    payload = os.urandom(2000)
    with connect(proxy) as sock:
        sock.sendall(payload)
        chunks = []
        while sum(map(len, chunks)) < len(payload):
            chunk = sock.recv(65536)
            assert chunk
            chunks.append(chunk)
    assert b"".join(chunks) == payload
    assert len(chunks) > 1


def test_limit_data_passes_exactly_n_bytes_then_eof(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "lim", "limit_data", "downstream", bytes=1000)
    payload = os.urandom(3000)
    with connect(proxy) as sock:
        sock.sendall(payload)
        assert recv_until_eof(sock) == payload[:1000]


def test_slow_close_delays_the_fin(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "sc", "slow_close", "downstream", delay=150)
    with connect(proxy) as sock:
        round_trip(sock, b"bye\n")
        t0 = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes; its FIN is held back
        assert recv_until_eof(sock) == b""
        assert time.monotonic() - t0 >= 0.150


def test_down_refuses_and_cuts_then_up_works(loop, make_proxy):
    proxy = make_proxy()
    with connect(proxy) as open_sock:
        round_trip(open_sock, b"before\n")
        loop.call(proxy.set_enabled, False)
        try:  # the open connection is cut (FIN; an RST is acceptable too)
            assert recv_until_eof(open_sock) == b""
        except ConnectionResetError:
            pass
    with pytest.raises((ConnectionRefusedError, ConnectionResetError)):
        connect(proxy).close()
    assert loop.call(proxy.state)["enabled"] is False
    loop.call(proxy.set_enabled, True)
    with connect(proxy) as sock:  # same address as before
        assert round_trip(sock, b"after\n") >= 0


def _affected(loop, make_proxy, seed, n=12):
    proxy = make_proxy(seed=seed)
    loop.call(proxy.add_toxic, "half", "limit_data", "downstream", toxicity=0.5, bytes=1)
    hit = []
    for _ in range(n):
        with connect(proxy) as sock:
            sock.sendall(b"hello")
            sock.shutdown(socket.SHUT_WR)
            hit.append(recv_until_eof(sock) == b"h")
    return hit


def test_toxicity_selects_the_same_connections_per_seed(loop, make_proxy):
    first = _affected(loop, make_proxy, seed=7)
    second = _affected(loop, make_proxy, seed=7)
    assert first == second
    assert 0 < sum(first) < len(first)  # a real subset
    assert _affected(loop, make_proxy, seed=8) != first


def test_toxicity_extremes(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "never", "timeout", toxicity=0.0, timeout=0)
    with connect(proxy) as sock:
        assert round_trip(sock, b"unaffected\n") >= 0
    assert loop.call(proxy.connections)[-1]["toxics"] == []


def test_reset_clears_everything(loop, make_proxy):
    proxy = make_proxy()
    loop.call(proxy.add_toxic, "a", "latency", latency=10_000)
    loop.call(proxy.add_toxic, "b", "timeout", "upstream", timeout=0)
    loop.call(proxy.set_enabled, False)
    loop.call(proxy.reset)
    state = loop.call(proxy.state)
    assert state["toxics"] == [] and state["enabled"] is True
    with connect(proxy) as sock:
        assert round_trip(sock, b"clean\n") >= 0


def test_upstream_unreachable_closes_the_client(loop, make_proxy):
    proxy = make_proxy()
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    loop.call(proxy.set_upstream, dead)
    with connect(proxy) as sock:
        assert recv_until_eof(sock) == b""
    loop.call(proxy.set_upstream, proxy.upstream)


def test_client_reset_does_not_disturb_the_proxy(loop, make_proxy):
    proxy = make_proxy()
    sock = connect(proxy)
    sock.sendall(b"x" * 1000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # RST
    with connect(proxy) as other:
        assert round_trip(other, b"still fine\n") >= 0


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("x", "nonsense"), {}, "unknown toxic type"),
        (("x", "latency"), {"latency": 1, "lag": 2}, "no attribute 'lag'"),
        (("x", "latency"), {"latency": -1}, "must be a number >= 0"),
        (("x", "latency"), {"latency": True}, "must be a number >= 0"),
        (("x", "latency"), {"latency": float("nan")}, "must be a number >= 0"),
        (("x", "latency"), {"latency": 1, "latency_ms": 2}, "given twice"),
        (("x", "latency", "sideways"), {}, "stream must be"),
        (("x", "latency"), {"toxicity": 1.5}, "toxicity must be"),
        (("x", "limit_data"), {"bytes": 1.5}, "must be an integer"),
        (("x", "slicer"), {"average_size": 10, "size_variation": 10}, "size_variation < average_size"),
        (("x", "slicer"), {}, "average_size >= 1"),
        (("", "latency"), {}, "toxic name"),
    ],
)
def test_validation_errors_are_clear(loop, make_proxy, args, kwargs, message):
    proxy = make_proxy()
    with pytest.raises(ValueError, match=message):
        loop.call(proxy.add_toxic, *args, **kwargs)
    assert loop.call(proxy.toxics) == []


def test_duplicate_and_missing_toxics(loop, make_proxy):
    from emulators.proxy import ConflictError, NotFoundError

    proxy = make_proxy()
    created = loop.call(proxy.add_toxic, "lat", "latency", latency=5)
    assert created == {
        "name": "lat",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 5, "jitter": 0},
    }
    with pytest.raises(ConflictError):
        loop.call(proxy.add_toxic, "lat", "latency", latency=5)
    with pytest.raises(NotFoundError, match="'nope' not found"):
        loop.call(proxy.remove_toxic, "nope")
    assert loop.call(proxy.toxics) == [created]


def test_non_loopback_listen_is_refused():
    from emulators.proxy import FaultProxy

    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("p", ("127.0.0.1", 1), seed=0, listen=("0.0.0.0", 0))  # noqa: S104
