"""The twin's SSH server base (emulators/sshserver.py): a minimal exec server built on it, served on 127.0.0.1 and
reached by a real paramiko client.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import paramiko
import pytest

from emulators.gpuhost.keys import new_ed25519
from emulators.sshserver import SshInterface, SshListener

USER = "alice"
CLIENT_KEY = new_ed25519()[0]
WAIT_S = 10.0  # a bound for what should happen at once; only a broken server gets near it


class _EchoInterface(SshInterface):
    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return self.record(channel, command.decode())


class EchoServer(SshListener):
    """Runs `echo <word>` (answers the word), and `block` (waits until the test releases it)."""

    threads = "echo"
    accept_poll_s = 0.1  # the fixture waits for the connections' threads

    def __init__(self, password: str | None = None) -> None:
        super().__init__("box", new_ed25519()[0])
        self.password = password
        self.release = threading.Event()
        self.blocked = threading.Event()

    def interface(self) -> SshInterface:
        return _EchoInterface(USER, CLIENT_KEY, self.password)

    def serve_channel(self, iface: SshInterface, channel: paramiko.Channel) -> None:
        command = iface.wait_answered(channel.get_id(), WAIT_S, lambda: channel.closed)
        if command == "block":
            self.blocked.set()
            self.release.wait(WAIT_S)
        elif command is not None:
            channel.sendall(command.removeprefix("echo ").encode())
            channel.send_exit_status(0)  # the base closes the channel right after


@pytest.fixture
def server() -> Iterator[EchoServer]:
    srv = EchoServer()
    srv.listen()
    yield srv
    srv.release.set()
    srv.stop_listening()
    srv.join()


def connect(srv: EchoServer, user: str = USER, **auth) -> paramiko.Transport:
    transport = paramiko.Transport(("127.0.0.1", srv.port))
    try:
        transport.connect(hostkey=srv.host_key, username=user, **auth)
    except BaseException:
        transport.close()
        raise
    return transport


def run(transport: paramiko.Transport, command: str) -> tuple[bytes, int]:
    channel = transport.open_session(timeout=WAIT_S)
    channel.settimeout(WAIT_S)
    channel.exec_command(command)
    out = b""
    while chunk := channel.recv(65536):
        out += chunk
    return out, channel.recv_exit_status()


def test_the_one_user_with_the_one_key_logs_in_and_runs_a_command(server):
    transport = connect(server, pkey=CLIENT_KEY)
    try:
        assert run(transport, "echo hello") == (b"hello", 0)
        assert run(transport, "echo again") == (b"again", 0)  # channels after the first on one connection
    finally:
        transport.close()


def test_another_key_or_another_user_is_refused(server):
    with pytest.raises(paramiko.AuthenticationException):
        connect(server, pkey=new_ed25519()[0])
    with pytest.raises(paramiko.AuthenticationException):
        connect(server, user="mallory", pkey=CLIENT_KEY)


def test_a_password_logs_in_only_where_the_server_has_one(server):
    with pytest.raises(paramiko.BadAuthenticationType) as refused:
        connect(server, password="secret")
    assert refused.value.allowed_types == ["publickey"]

    with_password = EchoServer(password="secret")
    with_password.listen()
    try:
        with pytest.raises(paramiko.AuthenticationException):
            connect(with_password, password="wrong")
        with pytest.raises(paramiko.AuthenticationException):
            connect(with_password, user="mallory", password="secret")
        transport = connect(with_password, password="secret")
        try:
            assert run(transport, "echo in") == (b"in", 0)
        finally:
            transport.close()
    finally:
        with_password.stop_listening()


def test_requests_the_server_does_not_accept_are_refused(server):
    transport = connect(server, pkey=CLIENT_KEY)
    try:
        for request in ("invoke_shell", "get_pty", "invoke_subsystem"):
            channel = transport.open_session(timeout=WAIT_S)
            args = ("sftp",) if request == "invoke_subsystem" else ()
            with pytest.raises(paramiko.SSHException):
                getattr(channel, request)(*args)
            channel.close()
        with pytest.raises(paramiko.ChannelException):
            transport.open_channel("direct-tcpip", ("127.0.0.1", 22), ("127.0.0.1", 0), timeout=WAIT_S)
        assert run(transport, "echo still-here") == (b"still-here", 0)  # the connection stays usable
    finally:
        transport.close()


def test_a_channel_that_closes_at_once_is_seen_to_have_started():
    """The work starts only once the request's reply is on the wire: else a channel closed at once looks, to the
    client, like a request that failed ("Channel closed").
    """
    srv = EchoServer()
    srv.listen()
    transport = connect(srv, pkey=CLIENT_KEY)
    try:
        for i in range(30):
            channel = transport.open_session(timeout=WAIT_S)
            channel.exec_command(f"echo {i}")  # raises if the channel closed before the reply arrived
            assert channel.recv_exit_status() == 0
    finally:
        transport.close()
        srv.stop_listening()


def test_a_recorded_request_is_handed_over_once_it_has_been_answered():
    iface = SshInterface(USER, CLIENT_KEY)
    channel = paramiko.Channel(7)
    iface.record(channel, "work")
    assert iface.wait_answered(7, 0.0) is None  # recorded, not answered: not yet
    iface.answered(8)  # another channel's reply
    assert iface.wait_answered(7, 0.0) is None
    iface.answered(7)
    assert iface.wait_answered(7, 0.0) == "work"
    assert iface.wait_answered(7, 0.0) is None  # handed over once
    iface.answered(7)  # a later request's reply (a pty, say) on the same channel starts nothing
    assert iface.wait_answered(7, 0.0) is None


def test_a_waiting_channel_wakes_when_answered_or_stopped():
    iface = SshInterface(USER, CLIENT_KEY)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(iface.wait_answered(3, WAIT_S)))
    waiter.start()
    iface.record(paramiko.Channel(3), "go")
    iface.answered(3)
    waiter.join(WAIT_S)
    assert got == ["go"]

    looks: list[int] = []

    def stopped() -> bool:  # the front end closes while the channel waits: true from its third look on
        looks.append(1)
        return len(looks) >= 3

    assert iface.wait_answered(4, WAIT_S, stopped) is None
    assert len(looks) == 3


def test_stop_listening_drops_the_connections_and_listen_opens_the_same_port_again(server):
    transport = connect(server, pkey=CLIENT_KEY)
    channel = transport.open_session(timeout=WAIT_S)
    channel.exec_command("block")
    assert server.blocked.wait(WAIT_S)
    names = {t.name for t in threading.enumerate()}
    assert {"echo-box", "echo-box-conn", "echo-box-chan"} <= names
    port = server.port

    server.stop_listening()
    transport.join(WAIT_S)  # the client's transport thread ends when the server drops the connection
    assert not transport.is_active()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=WAIT_S).close()

    server.listen()
    assert server.port == port
    again = connect(server, pkey=CLIENT_KEY)
    try:
        assert run(again, "echo back") == (b"back", 0)
    finally:
        again.close()
