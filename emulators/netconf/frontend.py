"""The switch's NETCONF front end: an SSH server (paramiko, thread-based) with the subsystem "netconf" (RFC 6242 §3).

Built, like the GPU hosts' SSH server (emulators/gpuhost/server.py), on emulators/sshserver.py, and sharing their
key store: one Ed25519 host key per switch listed in the twin's known_hosts under `[127.0.0.1]:<port>`, and the
twin's one client key. The switch's user (OcsSpec.user) logs in with that key or with
the twin's password (emulators.frontends.twin_password()).

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
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

import paramiko

from emulators.frontends import twin_password
from emulators.gpuhost.keys import KeyStore, keystore, new_ed25519
from emulators.netconf.framing import FrameReader, FramingError, frame
from emulators.netconf.replay import NetconfReplay
from emulators.netconf.server import NetconfOptions, NetconfServer, ServerSession, SessionEnd
from emulators.sshserver import SshInterface, SshListener

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


class _SubsystemInterface(SshInterface):
    """The subsystem "netconf" only; the user logs in with the client key or the twin's password."""

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        return name == "netconf" and self.record(channel, name)


class NetconfFrontend(SshListener):
    """`NetconfFrontend(engine, spec, **options)`: options are NetconfOptions' fields (revision, base11, ...),
    also read from a `netconf` mapping on the spec if it has one; the twin passes none (the defaults).
    """

    threads = "netconf"
    channel_threads = "session"
    accept_poll_s = POLL_S  # close() waits for the connections' threads

    def __init__(self, engine: Any, spec: Any, **options: Any) -> None:
        super().__init__(spec.name)
        self.options = _options(spec, options)
        self.engine = engine
        self.spec = spec
        self.server = NetconfServer(engine, self.options)
        self.sessions: list[dict] = []  # one record per session that ended (tests read it in-process)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keys: KeyStore | None = None
        self._closed = False
        self._sessions_lock = threading.Lock()

    @staticmethod
    def replay(engine: Any, spec: Any, **options: Any) -> NetconfReplay:
        """This front end without SSH, for `testbed replay` (emulators/netconf/replay.py)."""
        return NetconfReplay(engine, _options(spec, options))

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        self._loop = loop
        keys = self._keys = keystore()
        self.host_key = new_ed25519()[0]
        self.listen()
        keys.add_known_host(self.port, self.host_key)
        return {"netconf": self.address, "known_hosts": str(keys.known_hosts), "key_file": str(keys.key_file)}

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_listening()
        # The session threads may be waiting for this loop (a model access): join them off it.
        await asyncio.get_running_loop().run_in_executor(None, self.join)
        if self._keys is not None:
            self._keys.release()
            self._keys = None

    def interface(self) -> _SubsystemInterface:
        if self._keys is None:
            raise RuntimeError("the NETCONF front end is not started: its keys are made by start()")
        return _SubsystemInterface(self.spec.user, self._keys.client_key, twin_password())

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

    def serve_channel(self, iface: _SubsystemInterface, channel: paramiko.Channel) -> None:
        if iface.wait_answered(channel.get_id(), SUBSYSTEM_WAIT_S, lambda: self._closed or channel.closed) is None:
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
            with self._sessions_lock:  # recorded before the close, so whoever sees the close finds the record
                self.sessions.append(record)

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
                if opts.transcript:
                    record.setdefault("messages", []).append((message, reply.xml))
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
