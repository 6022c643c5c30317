"""DataPlane: loopback TCP relays between job ranks that pass bytes only along lit light paths.

One relay per (src host port, dst host port, target): it listens on 127.0.0.1:P and forwards every
accepted connection to 127.0.0.1:target_port (where the destination rank listens), on behalf of
src_host:src_port talking to dst_host:dst_port. It lives on the twin's event loop.

Gating (see paths.py for what "lit" means; both directions must be lit, as TCP needs both):
- at accept: a dark path resets the new connection at once (RST, SO_LINGER 0) and counts a refusal;
  on a lit path the relay connects to the destination rank, retrying for up to CONNECT_RETRY_S while
  it is not listening yet (ranks start in any order; the client's own handshake already completed),
  and resets the client if it never comes;
- on every chunk forwarded, and on a timer every `check_interval_s` while any connection is open:
  a path gone dark (circuit removed or re-pointed, port failed or disabled, the switch moving) cuts
  every connection through it with an RST on both sides and counts a cut.
So a rank whose ring crosses a broken circuit sees ECONNRESET within a few milliseconds.

All methods must be called on the loop's thread (the twin calls them from its control dispatch).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from emulators.dataplane.paths import LightPaths, couple_trunk_light

CHECK_INTERVAL_S = 0.002
CONNECT_RETRY_S = 10.0  # how long a relayed connection waits for its destination rank to listen
CONNECT_RETRY_INTERVAL_S = 0.02
HISTORY = 256  # recent refusals and cuts kept for state()
_LINGER_RST = struct.pack("ii", 1, 0)


def _why(path: dict[str, Any]) -> str:
    """The reason a path is dark: its first dark direction's."""
    return path["forward"]["why"] if not path["forward"]["lit"] else path["backward"]["why"]


def _rst_socket(sock: Any) -> None:
    """Close with an RST rather than a FIN: the peer sees ECONNRESET, as when a link dies mid-stream."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)


def _rst_transport(transport: asyncio.Transport | None) -> None:
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        _rst_socket(sock)
    transport.abort()


class _Side(asyncio.Protocol):
    """One end of a relayed connection: "client" (the src rank, accepted) or "upstream" (the dst rank)."""

    def __init__(self, conn: _Conn, name: str):
        self.conn, self.name = conn, name
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []  # data for this side that arrived before it was connected
        self.pending_eof = False
        self.got_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.pending:
            transport.write(b"".join(self.pending))
            self.pending.clear()
        if self.pending_eof and transport.can_write_eof():
            transport.write_eof()

    def data_received(self, data: bytes) -> None:
        self.conn.forward(self, data)

    def eof_received(self) -> bool:
        self.conn.eof(self)
        return True  # keep the other direction open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost(self, exc)

    def pause_writing(self) -> None:
        other = self.conn.other(self)
        if other.transport is not None:
            other.transport.pause_reading()

    def resume_writing(self) -> None:
        other = self.conn.other(self)
        if other.transport is not None:
            other.transport.resume_reading()


class _Conn:
    def __init__(self, relay: Relay, client: socket.socket, number: int):
        self.relay, self.number = relay, number
        self.client_sock: socket.socket | None = client  # until the loop owns it
        self.client = _Side(self, "client")
        self.upstream = _Side(self, "upstream")
        self.closed = False
        self.bytes = {"forward": 0, "backward": 0}

    def other(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.relay.plane.connect_retry_s
        while True:
            try:
                await loop.create_connection(lambda: self.upstream, self.relay.target_host, self.relay.target_port)
                break
            except OSError as exc:
                if self.closed:  # cut (path dark, relay closed) while waiting for the destination rank
                    return
                if loop.time() < deadline:
                    # The destination rank may still be starting: the client's handshake with the relay is
                    # already complete, so hold it (its bytes wait in the kernel) rather than reset it.
                    await asyncio.sleep(CONNECT_RETRY_INTERVAL_S)
                    continue
                self.relay.failed += 1
                self.relay.plane.record(self.relay, "upstream_failed", f"{self.relay.target}: {exc}")
                self.cut(None)
                return
        if self.closed:  # cut while connecting
            _rst_transport(self.upstream.transport)
            return
        sock, self.client_sock = self.client_sock, None
        assert sock is not None
        try:
            await loop.connect_accepted_socket(lambda: self.client, sock)
        except OSError:
            _rst_socket(sock)
            sock.close()
            self.cut(None)
            return
        if self.closed:
            _rst_transport(self.client.transport)

    def forward(self, side: _Side, data: bytes) -> None:
        if self.closed:
            return
        path = self.relay.path()
        if not path["lit"]:
            self.relay.cut_all(f"path dark: {_why(path)}")
            return
        direction = "forward" if side is self.client else "backward"
        self.bytes[direction] += len(data)
        self.relay.bytes[direction] += len(data)
        other = self.other(side)
        if other.transport is None:
            other.pending.append(data)
        else:
            other.transport.write(data)

    def eof(self, side: _Side) -> None:
        side.got_eof = True
        other = self.other(side)
        if other.transport is None:
            other.pending_eof = True
        elif other.transport.can_write_eof():
            other.transport.write_eof()
        if self.client.got_eof and self.upstream.got_eof:
            self._finish()
            for s in (self.client, self.upstream):
                if s.transport is not None:
                    s.transport.close()

    def lost(self, side: _Side, exc: Exception | None) -> None:
        if self.closed:
            return
        self._finish()
        other = self.other(side)
        if exc is not None:
            _rst_transport(other.transport)  # a reset propagates as a reset, as on a wire
        elif other.transport is not None:
            other.transport.close()  # flushes what is buffered, then FIN

    def cut(self, reason: str | None) -> None:
        """RST both sides; `reason` None = not counted as a cut (refused, failed, reset)."""
        if self.closed:
            return
        self._finish()
        if reason is not None:
            self.relay.cuts += 1
        if self.client_sock is not None:
            _rst_socket(self.client_sock)
            self.client_sock.close()
            self.client_sock = None
        _rst_transport(self.client.transport)
        _rst_transport(self.upstream.transport)

    def _finish(self) -> None:
        self.closed = True
        self.relay.conns.discard(self)


class Relay:
    def __init__(self, plane: DataPlane, src: tuple[str, str], dst: tuple[str, str], target_port: int):
        self.plane, self.src, self.dst, self.target_port = plane, src, dst, target_port
        # Where the destination rank listens: its host's address (127.0.0.1 on loopback, its namespace's
        # management address with --netns, docs/netns.md).
        self.target_host = plane.addresses.get(dst[0], "127.0.0.1")
        self.loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((plane.listen, 0))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.address = f"{plane.listen}:{sock.getsockname()[1]}"
        self.conns: set[_Conn] = set()
        self.accepted = self.refused = self.cuts = self.failed = 0
        self.bytes = {"forward": 0, "backward": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop.add_reader(sock.fileno(), self._accept)

    @property
    def target(self) -> str:
        return f"{self.target_host}:{self.target_port}"

    def path(self, now: float | None = None, cache: dict | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        return self.plane.paths.path(*self.src, *self.dst, now, cache)

    def lit(self, now: float | None = None, cache: dict | None = None) -> bool:
        return self.path(now, cache)["lit"]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, or the socket closed under us
                self.plane.record(self, "accept_failed", repr(exc))
                return
            client.setblocking(False)
            path = self.path()
            if not path["lit"]:
                self.refused += 1
                self.plane.record(self, "refused", _why(path))
                _rst_socket(client)
                client.close()
                continue
            self.accepted += 1
            conn = _Conn(self, client, self.accepted)
            self.conns.add(conn)
            task = self.loop.create_task(conn.open())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self.plane.watch()

    def cut_all(self, reason: str, *, count: bool = True) -> int:
        conns = list(self.conns)
        for conn in conns:
            conn.cut(reason if count else None)
        if conns and count:
            self.plane.record(self, "cut", f"{reason}; {len(conns)} connection(s)")
        return len(conns)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.cut_all("relay closed", count=False)
        for task in list(self._tasks):
            task.cancel()

    def state(self, now: float, cache: dict) -> dict[str, Any]:
        path = self.path(now, cache)
        return {
            "address": self.address,
            "src": {"host": self.src[0], "port": self.src[1]},
            "dst": {"host": self.dst[0], "port": self.dst[1]},
            "target": self.target,
            **path,
            "open": len(self.conns),
            "accepted": self.accepted,
            "refused": self.refused,
            "cut": self.cuts,
            "upstream_failed": self.failed,
            "bytes_forward": self.bytes["forward"],
            "bytes_backward": self.bytes["backward"],
        }


class DataPlane:
    """The twin's emulated data plane; control ops through `control(op, args)` (see emulators/twin.py)."""

    def __init__(
        self,
        fibres: Any,
        devices: Mapping[str, Any],
        *,
        trunks: Any = None,
        check_interval_s: float = CHECK_INTERVAL_S,
        connect_retry_s: float = CONNECT_RETRY_S,
        listen: str = "127.0.0.1",
        addresses: Mapping[str, str] | None = None,
    ):
        self.paths = LightPaths(fibres or [], devices, trunks=trunks)
        # Light crossing a trunk reaches the next switch's power monitors too (PMON reads the whole path).
        couple_trunk_light(self.paths.trunks, devices)
        self.check_interval_s = check_interval_s
        self.connect_retry_s = connect_retry_s
        # With --netns (docs/netns.md) the relays listen on the control side's management address, which every
        # host's namespace reaches, and connect to the destination host's address; on loopback both are 127.0.0.1.
        self.listen = listen
        self.addresses = dict(addresses or {})
        self.relays: dict[tuple[str, str, str, str, int], Relay] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._timer: asyncio.TimerHandle | None = None
        # With --netns the job's traffic crosses the kernel (emulators/dataplane/kernel.py), not these relays.
        self.kernel: Any = None

    # ---- control ops ----------------------------------------------------------------------------

    def link(self, src_host: str, src_port: str, dst_host: str, dst_port: str, target_port: int) -> str:
        """The relay address ("LISTEN:P") src_host:src_port uses to reach dst_host:dst_port's rank listening on
        its host's address:target_port; the same arguments give the same relay.
        """
        if isinstance(target_port, bool) or not isinstance(target_port, int) or not 1 <= target_port <= 65535:
            raise ValueError(f"target_port must be a TCP port 1..65535, got {target_port!r}")
        src = self.paths.fibre(src_host, src_port)
        dst = self.paths.fibre(dst_host, dst_port)
        key = (src.host, src.port, dst.host, dst.port, target_port)
        relay = self.relays.get(key)
        if relay is None:
            relay = self.relays[key] = Relay(self, (src.host, src.port), (dst.host, dst.port), target_port)
        return relay.address

    def path(self, src_host: str, src_port: str, dst_host: str, dst_port: str) -> dict[str, Any]:
        """Is there a light path between two host ports right now (both directions, with reasons)?"""
        return self.paths.path(src_host, src_port, dst_host, dst_port, time.monotonic())

    def routes(self, links: list) -> dict[str, int]:
        """With --netns: a launch's routes over its links (KernelPlane.routes)."""
        if self.kernel is None:
            raise ValueError("routes are the kernel data plane's: start the twin with --netns")
        return self.kernel.routes(links)

    def state(self) -> dict[str, Any]:
        now = time.monotonic()
        cache: dict = {}  # what the light paths read at this instant, read once
        relays = [r.state(now, cache) for r in self.relays.values()]
        kernel = self.kernel.state() if self.kernel is not None else None
        return {
            "now": now,
            "check_interval_ms": self.check_interval_s * 1000,
            "fibres": self.paths.fibre_map(),
            "trunks": self.paths.trunk_map(),
            "relays": relays,
            "totals": {
                "relays": len(relays),
                "open": sum(r["open"] for r in relays),
                "refused": sum(r["refused"] for r in relays),
                "cut": sum(r["cut"] for r in relays),
                "bytes": sum(r["bytes_forward"] + r["bytes_backward"] for r in relays),
                **({"kernel_bytes": sum(d["bytes"] for d in kernel["directions"])} if kernel else {}),
            },
            "events": list(self.events),
            **({"kernel": kernel} if kernel else {}),
        }

    def reset(self) -> None:
        """Close every relay (open connections get an RST) and forget the counters."""
        for relay in self.relays.values():
            relay.close()
        self.relays.clear()
        self.events.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def close(self) -> None:
        self.reset()
        await asyncio.sleep(0)  # let cancelled connection tasks finish

    def control(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One twin control request (op "dataplane.*") -> response; never raises."""
        handlers: dict[str, Callable[..., Any]] = {
            "dataplane.link": self.link,
            "dataplane.path": self.path,
            "dataplane.state": self.state,
            "dataplane.reset": self.reset,
            "dataplane.routes": self.routes,
        }
        handler = handlers.get(op)
        if handler is None:
            return {"ok": False, "error": f"unknown op {op!r} (dataplane ops: link, path, state, reset, routes)"}
        try:
            return {"ok": True, "result": handler(**args)}
        except Exception as exc:  # bad arguments, unknown host ports: the caller gets the message
            return {"ok": False, "error": f"{op} failed: {type(exc).__name__}: {exc}"}

    # ---- gating -----------------------------------------------------------------------------------

    def record(self, relay: Relay, what: str, why: str) -> None:
        self.events.append(
            {
                "t": time.monotonic(),
                "relay": relay.address,
                "src": f"{relay.src[0]}:{relay.src[1]}",
                "dst": f"{relay.dst[0]}:{relay.dst[1]}",
                "event": what,
                "why": why,
            }
        )

    def watch(self) -> None:
        """Make sure the periodic check runs (it stops by itself when no connection is open)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.check_interval_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = time.monotonic()
        cache: dict = {}  # what the light paths read at this instant, read once
        busy = False
        for relay in list(self.relays.values()):
            if not relay.conns:
                continue
            path = relay.path(now, cache)
            if path["lit"]:
                busy = True
                continue
            relay.cut_all(f"path dark: {_why(path)}")
        if busy:
            self.watch()
