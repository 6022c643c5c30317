"""A webhook's receiver for the tests: a real HTTP server (the standard library's http.server) on 127.0.0.1, that
takes each call (and keeps it), answers 500, or hangs until released; with TLS when given a certificate.
"""

from __future__ import annotations

import json
import queue
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CALL_WAIT_S = 120  # bound on waiting for a call to arrive (a slow CI machine), not a timing claim


class Receiver:
    """`answer`: the status each call gets (200, 500...); `hang`: hold each call unanswered until `close`."""

    def __init__(self, answer: int = 200, *, hang: bool = False, cert: Path | None = None, key: Path | None = None):
        self.answer, self.hang = answer, hang
        self.calls: queue.Queue[dict] = queue.Queue()
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.calls.put({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                if receiver.hang:
                    receiver.released.wait(CALL_WAIT_S)
                self.send_response(receiver.answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook", userinfo: str = "", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{userinfo}{host}:{self.port}{path}"

    def next_call(self) -> dict:
        return self.calls.get(timeout=CALL_WAIT_S)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
