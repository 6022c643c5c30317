"""An SSH server (paramiko, thread-based) in front of one emulated host's shell.

Public-key authentication only (one user, one client key). Exec channels only: the command is recorded
in check_channel_exec_request and run after transport.accept() hands over the channel (docs/protocols.md §4.1),
each channel in its own thread. A pty may be requested for an exec channel (OpenSSH's `ssh -tt`, which
Ansible uses for its `raw` module); the command then writes to a terminal, as under sshd: stderr is merged
into stdout and each "\n" goes out as "\r\n" (the tty's onlcr). Output is sent on the channel as the
command produces it (a `tail -F` streams), and a command learns that its client went away through the
stream's `closed()`.
`listen()` / `stop_listening()` let power_off refuse connections on the same port that power_on opens
again.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

import paramiko

from emulators.gpuhost.shell import Stream
from emulators.sshserver import AnsweringTransport, key_accepted

log = logging.getLogger(__name__)

Runner = Callable[[str, Stream], tuple[str, str, int]]
EXEC_WAIT_S = 30.0  # a client that opens a session but never sends exec is dropped after this


class _Interface(paramiko.ServerInterface):
    def __init__(self, user: str, client_key: paramiko.PKey) -> None:
        self.user = user
        self.client_key = client_key
        self.requested: dict[int, str] = {}  # exec requests not answered yet
        self.commands: dict[int, str] = {}  # exec requests answered: ready to run
        self.ptys: set[int] = set()  # channels that asked for a terminal
        self.cond = threading.Condition()

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key_accepted(self.user, self.client_key, username, key)
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        # Only record it: the command runs once the exec reply is on the wire (answered()). A command that
        # ran and closed its channel before that would make the client see "Channel closed" (a fast
        # builtin on a busy machine did).
        with self.cond:
            self.requested[channel.get_id()] = command.decode("utf-8", errors="replace")
        return True

    def answered(self, chanid: int) -> None:
        """paramiko has sent its reply to a channel request: an exec request's command may run now."""
        with self.cond:
            if chanid in self.requested:
                self.commands[chanid] = self.requested.pop(chanid)
                self.cond.notify_all()

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False  # no interactive shells: exec only

    def check_channel_pty_request(self, channel: paramiko.Channel, *args) -> bool:
        with self.cond:
            self.ptys.add(channel.get_id())
        return True

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return False  # like sshd without AcceptEnv

    def wait_command(self, chanid: int, timeout: float) -> tuple[str | None, bool]:
        """The channel's command (None if it never came) and whether the channel has a pty."""
        with self.cond:
            self.cond.wait_for(lambda: chanid in self.commands, timeout)
            tty = chanid in self.ptys
            self.ptys.discard(chanid)
            return self.commands.pop(chanid, None), tty


class SshServer:
    def __init__(self, name: str, host_key: paramiko.PKey, user: str, client_key: paramiko.PKey, run: Runner):
        self.name = name
        self.host_key = host_key
        self.user = user
        self.client_key = client_key
        self.run = run
        self.port = 0
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._transports: set[paramiko.Transport] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def listen(self) -> None:
        """Start accepting (on the same port as before, if there was one)."""
        with self._lock:
            if self._sock is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(64)
            self.port = sock.getsockname()[1]
            self._sock = sock
            self._thread = threading.Thread(
                target=self._accept_loop, args=(sock,), name=f"ssh-{self.name}", daemon=True
            )
            self._thread.start()

    def stop_listening(self) -> None:
        """Refuse new connections and drop the open ones."""
        with self._lock:
            sock, self._sock = self._sock, None
            thread, self._thread = self._thread, None
            transports, self._transports = list(self._transports), set()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
            except OSError:
                pass
            sock.close()
        for t in transports:
            t.close()
        if thread is not None:
            thread.join(5)

    def _accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name=f"ssh-{self.name}-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # As sshd does for interactive sessions: a job's log line streamed by `tail -F` is one small
        # segment, which Nagle's algorithm would hold until the previous one is acknowledged.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = AnsweringTransport(conn)
        with self._lock:
            if self._sock is None:  # powered off between accept and here
                transport.close()
                return
            self._transports.add(transport)
        try:
            transport.add_server_key(self.host_key)
            iface = _Interface(self.user, self.client_key)
            try:
                transport.start_server(server=iface)
            except (paramiko.SSHException, EOFError, OSError):
                return  # a client that hung up during the handshake (e.g. ssh-keyscan)
            while transport.is_active():
                channel = transport.accept(timeout=1.0)
                if channel is None:
                    continue
                threading.Thread(
                    target=self._channel, args=(iface, channel), name=f"ssh-{self.name}-chan", daemon=True
                ).start()
        finally:
            transport.close()
            with self._lock:
                self._transports.discard(transport)

    def _channel(self, iface: _Interface, channel: paramiko.Channel) -> None:
        try:
            command, tty = iface.wait_command(channel.get_id(), EXEC_WAIT_S)
            if command is None:
                return
            transport = channel.get_transport()

            def out(text: str) -> None:
                channel.sendall((text.replace("\n", "\r\n") if tty else text).encode())

            def err(text: str) -> None:
                if tty:  # one terminal for both streams
                    out(text)
                else:
                    channel.sendall_stderr(text.encode())

            stream = Stream(
                out=out, err=err, closed=lambda: channel.closed or transport is None or not transport.is_active()
            )
            try:
                stdout, stderr, rc = self.run(command, stream)
            except (OSError, EOFError, paramiko.SSHException):
                raise  # the client went away while the command wrote
            except Exception:  # a bug in the emulator must not look like a hung host
                log.exception("emulated host %s failed on %r", self.name, command)
                stdout, stderr, rc = "", f"emulated host {self.name}: internal error running {command!r}\n", 255
            if stdout:
                out(stdout)
            if stderr:
                err(stderr)
            channel.send_exit_status(rc)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client went away
        finally:
            channel.close()
