"""A scripted line-protocol device on a real TCP port, for the mesh drivers' hostile-input tests.

Each request line is answered by `reply(line)`: a str is sent with "\\n" after it, bytes are sent as they
are (a truncated or binary reply), None sends nothing (a SCPI set, or a device that stays silent). One
thread per connection, so a silent connection does not block the reconnect after a timeout. The same
pattern as tests/drivers/socket_servers.py, which is not importable from this folder.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

Reply = str | bytes | None


class LineServer:
    def __init__(self, reply: Callable[[str], Reply]) -> None:
        self.reply = reply
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def visa(self) -> str:
        return f"TCPIP0::127.0.0.1::{self.port}::SOCKET"

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while data := conn.recv(4096):
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    request = line.decode("latin-1").rstrip("\r")
                    with self._lock:
                        self.requests.append(request)
                    answer = self.reply(request)
                    if answer is not None:
                        conn.sendall(answer if isinstance(answer, bytes) else answer.encode("latin-1") + b"\n")
        except OSError:
            return

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
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
