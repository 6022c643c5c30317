"""A hub's direct channel: the engine's calls to a hub over one TCP connection instead of a Ray actor call.

A Ray call to an async actor costs about a millisecond before the hub starts it (docs/tuning.md), the whole of
the framework's share when a running job asks the fabric service for a change (docs/fabric_service.md: request ->
command, target 1 ms). Ray
stays the engine: it places, starts, restarts and kills the hubs and carries the channel's address and token;
the channel only carries calls and their results:

    engine (RayDispatcher)                                 hub actor (DeviceHub)
      open: hub.open_direct.remote(token, our IP) -------> listens (127.0.0.1 when on the engine's node)
      connect, send the token ---------------------------> compared in constant time, else closed
      (id, device, seq, method, args) -------------------> DeviceHub.call_threadsafe from the reader thread:
                                                           the device's lane starts its calls in the
      (id, ok, result or exception) <--------------------- dispatcher's numbers' order, whichever way each
                                      (sent by the device's thread)   came (a Ray call goes through the loop)

If the connection ends (the hub's process died, or the channel broke), every call waiting on it fails as
`ActorLost`, exactly as a Ray call to a dead actor does (the outcome is unknown), later calls go through Ray
again, and the dispatcher opens a new channel once the restarted hub answers.

Frames are a 4-byte big-endian length and a pickle. Nothing is unpickled before the token matches: a
connection's first frame is the token's bytes, compared with hmac.compare_digest. The token is made per
dispatcher and reaches the hub as a Ray call's argument (Ray's own cluster authentication covers it). The
listener is on 127.0.0.1 when the hub is on the engine's node, else on its node's IP (a lab's Ray cluster is on
the lab's control network, as Ray's own ports are).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hmac
import itertools
import logging
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # an OpResult with a long audit is kilobytes; a length beyond this is not ours
TOKEN_BYTES = 32


class ChannelClosed(Exception):
    """The direct connection ended."""


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def read_frame(stream: Any, limit: int = MAX_FRAME) -> bytes:
    """One frame from a file-like `stream` (socket.makefile('rb')); ChannelClosed at its end or on a bad length."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise ChannelClosed("the connection ended")
    (length,) = _LENGTH.unpack(head)
    if length > limit:
        raise ChannelClosed(f"a frame of {length} bytes (at most {limit})")
    payload = stream.read(length)
    if len(payload) < length:
        raise ChannelClosed("the connection ended mid-frame")
    return payload


def _tcp_nodelay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a call is one small frame: no Nagle wait


# --- the hub's side ----------------------------------------------------------------------------------------


class DirectListener:
    """Serves `call(device, seq, method, args, done)` (DeviceHub.call_threadsafe: started on the device's thread,
    `done(result, exception)` called there) to connections that present `token`. One thread accepts, one thread
    reads each connection and hands each call to its device's lane; the device's thread sends the answer. No hop
    through the hub's event loop either way.
    """

    def __init__(self, call: Callable[..., Any], token: bytes, host: str) -> None:
        self._call, self._token = call, token
        self._server = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._server.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="hub-direct-accept", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            _tcp_nodelay(conn)
            threading.Thread(target=self._serve, args=(conn,), name="hub-direct", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        send_lock = threading.Lock()
        stream = conn.makefile("rb")
        try:
            presented = read_frame(stream, limit=TOKEN_BYTES * 4)
            if not hmac.compare_digest(presented, self._token):
                log.warning("hub direct channel: a connection with the wrong token, closed")
                return
            while True:
                call_id, device, seq, method, args = pickle.loads(read_frame(stream))
                done = functools.partial(self._reply, conn, send_lock, call_id)
                self._call(device, seq, method, tuple(args), done)
        except (ChannelClosed, OSError):
            pass
        except Exception:  # a frame that is not a call: the engine's bug, not a device's; end this connection
            log.exception("hub direct channel: a frame that is not a call")
        finally:
            stream.close()
            conn.close()

    def _reply(
        self, conn: socket.socket, lock: threading.Lock, call_id: int, result: Any, exc: BaseException | None
    ) -> None:
        try:
            if exc is None:
                payload = pickle.dumps((call_id, True, result), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as unpicklable:  # a result that cannot cross: the engine hears why
            exc = RuntimeError(f"the answer could not be sent: {type(unpicklable).__name__}: {unpicklable}")
        if exc is not None:  # the call's own exception, raised where the engine waits for it
            try:
                payload = pickle.dumps((call_id, False, exc), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that cannot cross: its text does
                payload = pickle.dumps((call_id, False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        try:
            with lock:
                send_frame(conn, payload)
        except OSError:
            pass  # the engine went away; it fails its own waiting calls


# --- the engine's side ---------------------------------------------------------------------------------------


class DirectChannel:
    """One connection to one hub. `call` returns a concurrent.futures.Future of the hub's answer; every future
    still waiting when the connection ends fails with ChannelClosed.
    """

    def __init__(self, address: tuple[str, int], token: bytes, timeout_s: float = 10.0) -> None:
        self._sock = socket.create_connection(address, timeout=timeout_s)
        self._sock.settimeout(None)
        _tcp_nodelay(self._sock)
        send_frame(self._sock, token)
        self._ids = itertools.count()
        self._waiting: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self.alive = True
        self._reader = threading.Thread(target=self._read, name=f"direct {address[0]}:{address[1]}", daemon=True)
        self._reader.start()

    def call(self, device: str, seq: int, method: str, args: tuple) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if not self.alive:
                raise ChannelClosed("the hub's direct connection is closed")
            call_id = next(self._ids)
            self._waiting[call_id] = future
            try:
                send_frame(self._sock, pickle.dumps((call_id, device, seq, method, args), pickle.HIGHEST_PROTOCOL))
            except OSError as exc:
                del self._waiting[call_id]
                raise ChannelClosed(f"the hub's direct connection broke: {exc}") from None
        return future

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(5.0)
        self._sock.close()

    def _read(self) -> None:
        stream = self._sock.makefile("rb")
        reason = "the hub's direct connection ended (its process died, or the run is closing)"
        try:
            while True:
                call_id, ok, value = pickle.loads(read_frame(stream))
                with self._lock:
                    future = self._waiting.pop(call_id, None)
                if future is None:
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (ChannelClosed, OSError):
            pass
        except Exception as exc:  # a frame that is not an answer: the connection cannot be trusted further
            reason = f"the hub's direct connection sent what is not an answer: {type(exc).__name__}: {exc}"
            log.exception("direct channel: a frame that is not an answer")
        finally:
            with self._lock:
                self.alive = False
                waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                future.set_exception(ChannelClosed(reason))
            stream.close()
