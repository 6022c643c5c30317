"""Real local endpoints for the transport tests: a TCP server thread with scripted misbehaviour.

Each accepted connection gets its own thread, so a connection that is kept waiting does not block the
next one (VISA reconnects after a timeout). Behaviours act on each complete request line:
  reply    answer with `reply` (a str or a callable taking the request line): a str is sent with the
           terminator, bytes as they are (a truncated or binary reply), None sends nothing (a SCPI
           set, or a device that stays silent)
  silent   read and never answer
  fin      read the request, then close the connection normally (FIN)
  reset    read the request, then reset the connection (SO_LINGER 0 -> RST)
  partial  answer with the first bytes of `reply` and no terminator, then keep quiet
Text is latin-1 both ways, so every byte maps to one character (garbage replies are sent as written).
Here in tests/ so that every test folder can import it (tests/conftest.py puts this folder on sys.path).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

Reply = str | bytes | None


class ScriptedServer:
    def __init__(
        self,
        behaviour: str = "reply",
        reply: Reply | Callable[[str], Reply] = "OK",
        terminator: bytes = b"\r\n",
        port: int = 0,
    ) -> None:
        self.behaviour = behaviour
        self.reply = reply
        self.terminator = terminator
        self.requests: list[str] = []
        self.sent: list[str] = []  # replies, appended once sendall() has returned
        self.peers: list[tuple[str, int]] = []  # the client end of each accepted connection
        self.connections = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept_thread.start()

    @property
    def visa(self) -> str:
        return f"TCPIP0::127.0.0.1::{self.port}::SOCKET"

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            with self._lock:
                self.connections += 1
                self.peers.append(peer)
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    request = line.decode("latin-1").rstrip("\r")
                    with self._lock:
                        self.requests.append(request)
                    if not self._act(conn, request):
                        return
        except OSError:
            return

    def _act(self, conn: socket.socket, request: str) -> bool:
        """Handle one request; False ends the connection."""
        reply = self.reply(request) if callable(self.reply) else self.reply
        if self.behaviour == "reply":
            if reply is not None:
                conn.sendall(reply if isinstance(reply, bytes) else reply.encode("latin-1") + self.terminator)
                with self._lock:
                    self.sent.append(reply)
        elif self.behaviour == "partial":
            conn.sendall(reply.encode("latin-1")[: max(1, len(reply) // 2)])
        elif self.behaviour == "fin":
            conn.close()
            return False
        elif self.behaviour == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return False
        # "silent": read on, answer nothing
        return True

    def stop(self) -> None:
        self._stop.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self._accept_thread.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)


def client_receive_queue(server: ScriptedServer, connection: int = 0) -> int | None:
    """Bytes waiting unread at the client end of a connection, from /proc/net/tcp (Linux), or None.

    Lets a test wait until data has really reached the client's socket, instead of sleeping.
    """
    host, port = server.peers[connection]
    local = f"{_hex_ip(host)}:{port:04X}"
    remote = f"{_hex_ip('127.0.0.1')}:{server.port:04X}"
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[2] == remote:
                return int(fields[4].split(":")[1], 16)
    return None


def _hex_ip(ip: str) -> str:
    return socket.inet_aton(ip)[::-1].hex().upper()  # /proc/net/tcp prints little-endian hex


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll a real condition (not a sleep standing in for one) until it holds or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
