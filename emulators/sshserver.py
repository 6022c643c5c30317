"""What the twin's SSH servers share (the GPU hosts' exec server, the switches' NETCONF subsystem): the server
interface that logs in the one user and records channel requests, and the listening server around it.

paramiko calls a ServerInterface's check_channel_*_request before it sends the reply. A server that starts
the channel's work there (runs the command, sends the NETCONF hello) can finish and close the channel before
the client has seen "request succeeded", and the client then reports "Channel closed" (a fast command on a
busy machine did). So the servers only record the request there (`SshInterface.record`), and the channel's
thread starts the work once `answered(chanid)` has been called, which `AnsweringTransport` does right after
the reply is on the wire.
"""

from __future__ import annotations

import hmac
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import paramiko

STOP_POLL_S = 0.1  # how often a wait for a channel request looks at its stop condition
JOIN_S = 5.0  # how long stopping waits for the server's threads


def _handle_request_then_answered(channel: paramiko.Channel, m: paramiko.Message) -> None:
    # answers the request on the wire (success or failure); a private method, which the stubs do not declare
    paramiko.Channel._handle_request(channel, m)  # type: ignore[attr-defined]
    server = channel.transport.server_object if channel.transport is not None else None
    answered = getattr(server, "answered", None)
    if answered is not None:
        answered(channel.get_id())


class AnsweringTransport(paramiko.Transport):
    """paramiko's server transport, calling its server interface's `answered(chanid)` once a channel request
    has been answered.
    """

    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,  # type: ignore[attr-defined]  # private, as above
        paramiko.common.MSG_CHANNEL_REQUEST: _handle_request_then_answered,
    }


class SshInterface(paramiko.ServerInterface):
    """One connection's server interface: the one user logs in with the one client key (or with `password`, if
    one is given), opens session channels, and is refused every channel request a subclass does not accept (no
    shell, exec, subsystem, pty or environment). A subclass accepts a request by recording it with `record`;
    the channel's thread then takes it with `wait_answered`.
    """

    def __init__(self, user: str, client_key: paramiko.PKey, password: str | None = None) -> None:
        self.user = user
        self.client_key = client_key
        self.password = password
        self._requested: dict[int, Any] = {}  # channel requests accepted, not answered yet
        self._answered: dict[int, Any] = {}  # answered on the wire: the channel's work may start
        self._cond = threading.Condition()

    def get_allowed_auths(self, username: str) -> str:
        return "publickey" if self.password is None else "publickey,password"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = (
            username == self.user
            and key.get_name() == self.client_key.get_name()
            and key.asbytes() == self.client_key.asbytes()
        )
        return paramiko.common.AUTH_SUCCESSFUL if ok else paramiko.common.AUTH_FAILED

    def check_auth_password(self, username: str, password: str) -> int:
        ok = (
            self.password is not None
            and username == self.user
            and hmac.compare_digest(password.encode(), self.password.encode())
        )
        return paramiko.common.AUTH_SUCCESSFUL if ok else paramiko.common.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.common.OPEN_SUCCEEDED
        return paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return False

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        return False

    def check_channel_pty_request(self, channel: paramiko.Channel, *args: Any) -> bool:
        return False

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return False  # like sshd without AcceptEnv

    def record(self, channel: paramiko.Channel, request: Any) -> bool:
        """Accept a channel request (`request`, not None, is what the channel's thread gets) without starting it."""
        with self._cond:
            self._requested[channel.get_id()] = request
        return True

    def answered(self, chanid: int) -> None:
        """paramiko has sent its reply to a channel request: a recorded request may start now."""
        with self._cond:
            if chanid in self._requested:
                self._answered[chanid] = self._requested.pop(chanid)
                self._cond.notify_all()

    def wait_answered(self, chanid: int, timeout: float, stop: Callable[[], bool] | None = None) -> Any | None:
        """The request recorded for the channel once it has been answered, or None if that did not happen within
        `timeout` (or before `stop()` became true).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while chanid not in self._answered and not (stop is not None and stop()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left if stop is None else min(left, STOP_POLL_S))
            return self._answered.pop(chanid, None)


Interface = TypeVar("Interface", bound="SshInterface")  # a listener's kind of connection interface


class SshListener(Generic[Interface]):
    """An SSH server on 127.0.0.1: `listen()` accepts connections (on the port it had before, if any) and
    `stop_listening()` refuses new ones and drops the open ones. Every connection has its own thread, and so has
    every channel opened on it, where `serve_channel` does the subclass's work; `interface()` makes each
    connection's server interface. Threads are named `<threads>-<name>` (accepting), `...-conn` (a connection)
    and `...-<channel_threads>` (a channel).
    """

    threads = "ssh"
    channel_threads = "chan"
    accept_poll_s = 1.0  # how soon a connection's thread notices that its transport has closed

    def __init__(self, name: str, host_key: paramiko.PKey | None = None) -> None:
        self.name = name
        self.host_key = host_key
        self.bind = "127.0.0.1"  # an emulated host in a namespace of its own listens on its address there
        self.port = 0
        self._lock = threading.RLock()  # listen() starts the accepting thread under it
        self._sock: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._transports: set[paramiko.Transport] = set()

    def interface(self) -> Interface:
        """A new connection's server interface."""
        raise NotImplementedError

    def serve_channel(self, iface: Interface, channel: paramiko.Channel) -> None:
        """A channel's life, on a thread of its own (the channel is closed after it); `iface` is its
        connection's interface.
        """
        raise NotImplementedError

    @property
    def address(self) -> str:
        return f"{self.bind}:{self.port}"

    def listen(self) -> None:
        """Start accepting (on the same port as before, if there was one)."""
        with self._lock:
            if self._sock is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.bind, self.port))
            sock.listen(64)
            self.port = sock.getsockname()[1]
            self._sock = sock
            self._accepting = self._spawn(self._accept_loop, sock, name=f"{self.threads}-{self.name}")

    def stop_listening(self) -> None:
        """Refuse new connections and drop the open ones."""
        with self._lock:
            sock, self._sock = self._sock, None
            accepting, self._accepting = self._accepting, None
            transports, self._transports = list(self._transports), set()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
            except OSError:
                pass
            sock.close()
        for t in transports:
            t.close()
        if accepting is not None:
            accepting.join(JOIN_S)

    def join(self) -> None:
        """Wait (up to JOIN_S in all) for the threads of connections and channels to end."""
        deadline = time.monotonic() + JOIN_S
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads or time.monotonic() > deadline:
                return
            threads[0].join(max(0.0, deadline - time.monotonic()))

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        # Entered and started under the lock: join() never meets a thread that is not started yet (joining one
        # raises), and a thread that could not start is not left behind for it.
        with self._lock:
            self._threads.add(thread)
            try:
                thread.start()
            except BaseException:
                self._threads.discard(thread)
                raise
        return thread

    def _accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self._spawn(self._serve, conn, name=f"{self.threads}-{self.name}-conn")

    def _serve(self, conn: socket.socket) -> None:
        # As sshd does for interactive sessions: a reply or a streamed log line is one small segment, which
        # Nagle's algorithm would hold until the previous one is acknowledged.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = AnsweringTransport(conn)
        with self._lock:
            if self._sock is None:  # stopped listening between accept and here
                transport.close()
                return
            self._transports.add(transport)
        try:
            assert self.host_key is not None  # given, or set by the subclass before it listens
            transport.add_server_key(self.host_key)
            iface = self.interface()
            try:
                transport.start_server(server=iface)
            except (paramiko.SSHException, EOFError, OSError):
                return  # a client that hung up during the handshake (e.g. ssh-keyscan)
            while transport.is_active():
                channel = transport.accept(timeout=self.accept_poll_s)
                if channel is not None:
                    name = f"{self.threads}-{self.name}-{self.channel_threads}"
                    self._spawn(self._channel, iface, channel, name=name)
        finally:
            transport.close()
            with self._lock:
                self._transports.discard(transport)

    def _channel(self, iface: Interface, channel: paramiko.Channel) -> None:
        try:
            self.serve_channel(iface, channel)
        finally:
            try:
                channel.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is already gone
