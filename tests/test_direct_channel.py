"""A hub's direct channel (testbed/engine/direct.py): the engine's calls to a hub over one TCP connection,
started in the dispatcher's numbers' order like Ray's calls, only after the token; a connection that ends fails
its waiting calls. The hub here is the real DeviceHub on an event loop of its own, as its Ray actor runs it.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.transports import TransportSettings
from testbed.engine.direct import ChannelClosed, DirectChannel, read_frame, send_frame
from testbed.engine.dispatch import ActorLost, _DirectPending
from testbed.engine.hub import DeviceHub, DeviceSpec

TOKEN = b"t" * 32


class Recorder:
    """Stands in for a DeviceActor's methods: records the calls in the order they ran."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def run(self, n: int, _kwargs: dict) -> int:
        self.release.wait(10)
        self.calls.append(n)
        return n * 10

    def fail(self) -> None:
        raise LookupError("no such port: 99")


@pytest.fixture
def hub():
    """A hub of two devices on an event loop thread of its own, listening for direct channels."""
    spec = TransportSettings("visa", "TCPIP0::192.0.2.1::5025::SOCKET")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    hub = DeviceHub([DeviceSpec(n, "no-such-driver", spec) for n in ("a", "b")])
    recorders = {n: Recorder() for n in ("a", "b")}
    for n, recorder in recorders.items():
        hub._lanes[n].actor = recorder
    address = asyncio.run_coroutine_threadsafe(hub.open_direct(TOKEN), loop).result(5)
    yield hub, recorders, address
    for listener in hub._listeners:
        listener.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_calls_over_the_channel_run_in_their_numbers_order_and_return_their_values(hub):
    _, recorders, address = hub
    assert address[0] == "127.0.0.1"  # outside Ray the engine is on the hub's node: loopback only
    channel = DirectChannel(address, TOKEN)
    try:
        order = list(range(30))
        random.Random(3).shuffle(order)  # frames in any order: the hub's lanes start them by number
        futures = {(dev, n): channel.call(dev, n, "run", (n, {})) for n in order for dev in ("a", "b")}
        assert {k: f.result(10) for k, f in futures.items()} == {(dev, n): n * 10 for dev, n in futures}
        assert recorders["a"].calls == list(range(30)) and recorders["b"].calls == list(range(30))
    finally:
        channel.close()


def test_a_calls_exception_is_raised_where_the_engine_waits(hub):
    channel = DirectChannel(hub[2], TOKEN)
    try:
        with pytest.raises(LookupError, match="no such port: 99"):
            channel.call("a", 0, "fail", ()).result(10)
        with pytest.raises(KeyError):  # a device the hub does not serve
            channel.call("zz", 0, "run", (1, {})).result(10)
        assert channel.call("a", 1, "run", (7, {})).result(10) == 70  # the channel goes on
    finally:
        channel.close()


def test_a_wrong_token_is_closed_before_anything_runs_and_the_hub_still_serves(hub):
    _, recorders, address = hub
    with socket.create_connection(address, timeout=5) as sock:
        send_frame(sock, b"x" * 32)
        send_frame(sock, b"\x80\x05N.")  # a pickle: never read
        try:
            closed = sock.recv(1) == b""  # closed by the hub
        except ConnectionResetError:  # closed with the unread pickle still queued: TCP answers with a reset
            closed = True
        assert closed
    wrong = DirectChannel(address, b"y" * 32)
    with pytest.raises(ChannelClosed):
        wrong.call("a", 0, "run", (1, {})).result(10)
    assert not wrong.alive  # it knows: the dispatcher sends through Ray instead
    wrong.close()
    assert recorders["a"].calls == []
    good = DirectChannel(address, TOKEN)
    try:
        assert good.call("a", 0, "run", (5, {})).result(10) == 50
    finally:
        good.close()


def test_calls_waiting_when_the_connection_ends_fail_as_the_actor_lost(hub):
    _, recorders, address = hub
    recorders["a"].release.clear()  # the call blocks in the device's thread
    channel = DirectChannel(address, TOKEN)
    pending = _DirectPending("a", channel.call("a", 0, "run", (1, {})))
    channel._sock.shutdown(socket.SHUT_RDWR)  # as when the hub's process dies: the connection ends
    with pytest.raises(ActorLost, match="direct connection ended"):
        pending.result(10)
    with pytest.raises(ChannelClosed):
        channel.call("a", 1, "run", (2, {}))
    recorders["a"].release.set()
    channel.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_fuzz_whatever_bytes_reach_the_listener_nothing_runs_and_it_still_serves(hub, data):
    _, recorders, address = hub
    with socket.create_connection(address, timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):  # no answer is ever sent before the token: only the close
                pytest.fail("the listener answered bytes that are not the token")
        except (ConnectionResetError, BrokenPipeError):
            pass
    assert recorders["a"].calls == [] and recorders["b"].calls == []


def test_read_frame_refuses_a_length_beyond_its_limit():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"\xff\xff\xff\xff")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ChannelClosed, match="at most"):
            read_frame(b.makefile("rb"), limit=1024)
