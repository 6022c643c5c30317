"""The switch's NETCONF front end: an SSH server (paramiko, thread-based) with the subsystem "netconf" (RFC 6242 §3).

Like the GPU hosts' SSH server (emulators/gpuhost/server.py), whose key store it shares: one Ed25519 host key per
switch listed in the twin's known_hosts under `[127.0.0.1]:<port>`, and the twin's one client key. The switch's
user (OcsSpec.user) logs in with that key or with emulators.frontends.TWIN_PASSWORD.

Each channel that asks for the subsystem is one NETCONF session, served on a thread of its own: framing
(emulators/netconf/framing.py) and XML (emulators/netconf/server.py) are handled there, and every access to the
switch model is handed to the twin's event loop, where the SCPI and TL1 front ends change the same engine (it is
not thread-safe). The subsystem starts only once its request has been answered on the wire, as the GPU hosts'
exec does: a hello racing the CHANNEL_SUCCESS could otherwise reach a client before it is ready.

Bounds: a message may not exceed NetconfOptions.max_message bytes, a message begun must end within
message_timeout_s, and the client's hello must come within hello_timeout_s; past any of them the session gets
one rpc-error (none for a missing hello) and is closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import paramiko

from emulators.frontends import TWIN_PASSWORD
from emulators.gpuhost.keys import keystore, new_ed25519
from emulators.netconf.framing import FrameReader, FramingError, frame
from emulators.netconf.replay import NetconfReplay
from emulators.netconf.server import NetconfOptions, NetconfServer, ServerSession, SessionEnd
from emulators.sshserver import AnsweringTransport, key_accepted

log = logging.getLogger(__name__)

T = TypeVar("T")
SUBSYSTEM_WAIT_S = 30.0  # a channel that never asks for the subsystem is dropped after this
POLL_S = 0.1  # how often a session thread looks at its deadlines while the client is silent
SEND_TIMEOUT_S = 30.0  # a client that stops reading a reply loses its session
LOOP_WAIT_S = 30.0  # the twin's loop must run a model access within this


class ModelGone(Exception):
    """The front end is closing (or the twin's loop is gone): the session ends."""


def _options(spec: Any, options: dict[str, Any]) -> NetconfOptions:
    known = {f.name for f in fields(NetconfOptions)}
    given = {**(getattr(spec, "netconf", None) or {}), **options}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown NETCONF front-end option(s) {unknown} (known: {sorted(known)})")
    return NetconfOptions(**given)


class _Interface(paramiko.ServerInterface):
    def __init__(self, user: str, client_key: paramiko.PKey, password: str) -> None:
        self.user = user
        self.client_key = client_key
        self.password = password
        self.requested: set[int] = set()  # subsystem requests not answered yet
        self.ready: set[int] = set()  # answered: the session may start
        self.cond = threading.Condition()

    def get_allowed_auths(self, username: str) -> str:
        return "publickey,password"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key_accepted(self.user, self.client_key, username, key)
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_auth_password(self, username: str, password: str) -> int:
        ok = username == self.user and hmac.compare_digest(password.encode(), self.password.encode())
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        if name != "netconf":
            return False
        with self.cond:
            self.requested.add(channel.get_id())
        return True

    def answered(self, chanid: int) -> None:
        """paramiko has sent its reply to a channel request: a requested subsystem may start now."""
        with self.cond:
            if chanid in self.requested:
                self.requested.discard(chanid)
                self.ready.add(chanid)
                self.cond.notify_all()

    def wait_subsystem(self, chanid: int, timeout: float, stop: Callable[[], bool]) -> bool:
        """Whether the channel asked for the subsystem (and was answered) within `timeout`, or before `stop()`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while chanid not in self.ready and not stop() and time.monotonic() < deadline:
                self.cond.wait(POLL_S)
            found = chanid in self.ready
            self.ready.discard(chanid)
            return found

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return False  # a NETCONF server: the subsystem only

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False

    def check_channel_pty_request(self, channel: paramiko.Channel, *args: Any) -> bool:
        return False


class NetconfFrontend:
    """`NetconfFrontend(engine, spec, **options)`: options are NetconfOptions' fields (revision, base11, ...),
    also read from a `netconf` mapping on the spec if it has one; the twin passes none (the defaults).
    """

    def __init__(self, engine: Any, spec: Any, **options: Any) -> None:
        self.options = _options(spec, options)
        self.engine = engine
        self.spec = spec
        self.name = spec.name
        self.server = NetconfServer(engine, self.options)
        self.sessions: list[dict] = []  # one record per session that ended (tests read it in-process)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keys = None
        self._host_key: paramiko.PKey | None = None
        self._sock: socket.socket | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._transports: set[paramiko.Transport] = set()

    @staticmethod
    def replay(engine: Any, spec: Any, **options: Any) -> NetconfReplay:
        """This front end without SSH, for `testbed replay` (emulators/netconf/replay.py)."""
        return NetconfReplay(engine, _options(spec, options))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        self._loop = loop
        self._keys = keystore()
        self._host_key = new_ed25519()[0]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._keys.add_known_host(self.port, self._host_key)
        self._spawn(self._accept_loop, sock, name=f"netconf-{self.name}")
        keys = self._keys
        return {"netconf": self.address, "known_hosts": str(keys.known_hosts), "key_file": str(keys.key_file)}

    async def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sock, self._sock = self._sock, None
            transports = list(self._transports)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
            except OSError:
                pass
            sock.close()
        for t in transports:
            t.close()
        # The session threads may be waiting for this loop (a model access): join them off it.
        await asyncio.get_running_loop().run_in_executor(None, self._join)
        if self._keys is not None:
            self._keys.release()
            self._keys = None

    # -- threads ------------------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _join(self) -> None:
        deadline = time.monotonic() + 5.0
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads or time.monotonic() > deadline:
                return
            threads[0].join(max(0.0, deadline - time.monotonic()))

    def _accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self._spawn(self._serve, conn, name=f"netconf-{self.name}-conn")

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # replies are small: no Nagle delay
        transport = AnsweringTransport(conn)
        with self._lock:
            if self._closed:
                transport.close()
                return
            self._transports.add(transport)
        try:
            transport.add_server_key(self._host_key)
            iface = _Interface(self.spec.user, self._keys.client_key, TWIN_PASSWORD)
            try:
                transport.start_server(server=iface)
            except (paramiko.SSHException, EOFError, OSError):
                return  # a client that hung up during the handshake (e.g. ssh-keyscan)
            while transport.is_active() and not self._closed:
                channel = transport.accept(timeout=POLL_S)
                if channel is not None:
                    self._spawn(self._channel, iface, channel, name=f"netconf-{self.name}-session")
        finally:
            transport.close()
            with self._lock:
                self._transports.discard(transport)

    # -- one NETCONF session ----------------------------------------------------------------------

    def _run(self, fn: Callable[[], T]) -> T:
        """Run a model access on the twin's loop and wait for it."""
        loop = self._loop
        if self._closed or loop is None or loop.is_closed():
            raise ModelGone("the NETCONF front end is closing")
        future: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the RpcError a handler raises is the caller's to answer
                    future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop closed under us
            raise ModelGone("the twin's event loop is closed") from None
        try:
            return future.result(timeout=LOOP_WAIT_S)
        except concurrent.futures.TimeoutError:
            raise ModelGone(f"the twin's event loop did not answer within {LOOP_WAIT_S:g} s") from None

    def _channel(self, iface: _Interface, channel: paramiko.Channel) -> None:
        if not iface.wait_subsystem(channel.get_id(), SUBSYSTEM_WAIT_S, lambda: self._closed or channel.closed):
            channel.close()
            return
        record: dict[str, Any] = {"user": self.spec.user, "framing": None, "end": "?"}
        session: ServerSession | None = None
        try:
            session = self._run(self.server.new_session)
            record["session_id"] = session.id
            record["end"] = self._converse(session, channel, record)
        except ModelGone as exc:
            record["end"] = str(exc)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            record["end"] = f"connection lost: {exc!r}"
        except Exception as exc:  # an emulator bug must not look like a hung switch: close, and say why in the log
            log.exception("NETCONF session on %s failed", self.name)
            record["end"] = f"internal error: {exc!r}"
        finally:
            if session is not None:
                try:
                    self._run(session.end)  # its lock goes with it
                except ModelGone:
                    pass
            with self._lock:  # recorded before the close, so whoever sees the close finds the record
                self.sessions.append(record)
            try:
                channel.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is already gone

    def _converse(self, session: ServerSession, channel: paramiko.Channel, record: dict) -> str:
        """The session's life; returns why it ended."""
        opts = self.options
        reader = FrameReader(opts.max_message)
        self._send(channel, frame(session.hello(), chunked=False))
        hello_by = time.monotonic() + opts.hello_timeout_s
        begun: float | None = None  # when the message being received began
        channel.settimeout(POLL_S)
        while True:
            try:
                data = channel.recv(65536)
                if not data:
                    return "closed by the client"
                reader.feed(data)
            except TimeoutError:
                pass
            while True:
                try:
                    message = reader.next_message()
                except FramingError as exc:
                    self._send(channel, frame(session.error_reply(exc.tag, str(exc)), reader.chunked))
                    return f"framing error: {exc}"
                if message is None:
                    break
                begun = None
                if session.base11 is None:
                    try:
                        reader.chunked = session.handle_hello(message)
                    except SessionEnd as exc:
                        return f"bad hello: {exc}"
                    record["framing"] = "1.1" if reader.chunked else "1.0"
                    continue
                reply = session.handle(message, self._run)
                if reply.xml is not None:
                    self._send(channel, frame(reply.xml, reader.chunked))
                if reply.close:
                    return "close-session"
            now = time.monotonic()
            if session.base11 is None and now > hello_by:
                return f"no hello within {opts.hello_timeout_s:g} s"
            if reader.in_message:
                begun = begun or now
                if now - begun > opts.message_timeout_s:
                    text = f"a message begun {opts.message_timeout_s:g} s ago never ended"
                    self._send(channel, frame(session.error_reply("malformed-message", text), reader.chunked))
                    return text

    @staticmethod
    def _send(channel: paramiko.Channel, data: bytes) -> None:
        channel.settimeout(SEND_TIMEOUT_S)
        try:
            channel.sendall(data)
        finally:
            channel.settimeout(POLL_S)
