"""The ranks' side of the fabric service: ask the framework for a fabric configuration at a phase boundary.

    from hostside.fabric_client import FabricClient

    fabric = FabricClient(rank=rank)      # the address and token from TESTBED_FABRIC_SERVICE, TESTBED_FABRIC_TOKEN
    fabric.prepare("allreduce-ring")      # ahead of the phase
    fabric.setup("allreduce-ring")        # blocks until the fabric is set; FabricRefused if it will not be
    ...
    fabric.release("allreduce-ring")

Cheap to import in a training process: the standard library and `hostside.fabric_protocol`, nothing else of
the framework (no Ray, no pydantic). One client is one connection, used by one call at a time (a lock serialises
the calls of several threads).

If the connection is lost (the coordinator restarted: a reset, or the connection closed), the client reconnects,
says hello again and sends the same request again (same id), for up to `retry_s` seconds; after that, or if no
answer comes within `answer_timeout_s`, it raises `FabricUnavailable`. Requests are idempotent by nature (set the
fabric to X, X will be wanted, X is no longer wanted), so a request the old server had already carried out is
carried out again harmlessly.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import BinaryIO

from hostside.fabric_protocol import (
    ENV_ADDRESS,
    ENV_TOKEN,
    MAX_LINE,
    Answer,
    ConfigRequest,
    Prepare,
    ProtocolError,
    Release,
    Setup,
    encode,
    parse_answer,
)

ENV_RANK = "RANK"  # torchrun's, when no rank is given


class FabricError(Exception):
    """The fabric service did not do what a rank asked."""


class FabricRefused(FabricError):
    """The service answered no. `kind` says why: refused (not allowed, or the coordinator refused), unauthorised
    (the wrong token), invalid (a request it could not read), failed (the coordinator failed carrying it out).
    """

    def __init__(self, reason: str, kind: str, answer: Answer | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.answer = answer


class FabricUnavailable(FabricError):
    """No answer: the service could not be reached within the retry budget, or did not answer in time."""


class _Lost(Exception):
    """The connection ended under a request (internal: the request is sent again on a new connection)."""


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class FabricClient:
    def __init__(
        self,
        address: str | tuple[str, int] | None = None,
        token: str | None = None,
        rank: int | None = None,
        *,
        retry_s: float = 10.0,
        connect_timeout_s: float = 2.0,
        answer_timeout_s: float | None = 300.0,
    ) -> None:
        if address is None:
            if ENV_ADDRESS not in os.environ:
                raise FabricUnavailable(f"no fabric service address given, and {ENV_ADDRESS} is not set")
            address = os.environ[ENV_ADDRESS]
        self.address = parse_address(address) if isinstance(address, str) else (str(address[0]), int(address[1]))
        if token is None:
            token = os.environ.get(ENV_TOKEN)
            if not token:
                raise FabricUnavailable(f"no fabric service token given, and {ENV_TOKEN} is not set")
        self._token = token
        if rank is None:
            if not os.environ.get(ENV_RANK, "").isdigit():
                raise ValueError(f"no rank given, and {ENV_RANK} is not a rank")
            rank = int(os.environ[ENV_RANK])
        self.rank = rank
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self.connections = 0  # made so far: more than one means the client reconnected
        self._sock: socket.socket | None = None
        self._rfile: BinaryIO | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def setup(self, config: str, t_job_ns: int | None = None) -> Answer:
        """Have the fabric set to `config`; returns when it is (the answer, with the server's timestamps)."""
        return self._call(Setup, config, t_job_ns)

    def prepare(self, config: str, t_job_ns: int | None = None) -> Answer:
        return self._call(Prepare, config, t_job_ns)

    def release(self, config: str, t_job_ns: int | None = None) -> Answer:
        return self._call(Release, config, t_job_ns)

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    def __enter__(self) -> FabricClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the conversation ---------------------------------------------------------------------------------------

    def _call(self, kind: type[ConfigRequest], config: str, t_job_ns: int | None) -> Answer:
        op = {Setup: "setup", Prepare: "prepare", Release: "release"}[kind]
        request_id = f"{self.rank}-{next(self._ids)}"
        stamp = time.time_ns() if t_job_ns is None else t_job_ns
        line = encode(kind(op=op, config=config, id=request_id, t_job_ns=stamp).to_wire())
        with self._lock:
            answer = self._exchange(line)
        if answer.id != request_id:
            raise FabricRefused(f"an answer to {answer.id!r}, not to {request_id!r}", "invalid", answer)
        if not answer.ok:
            raise FabricRefused(answer.error or "refused", answer.kind or "refused", answer)
        return answer

    def _exchange(self, line: bytes) -> Answer:
        """Send one request line and read its answer, reconnecting while the retry budget lasts."""
        deadline: float | None = None  # set at the first failure: the budget is per outage
        delay = 0.05
        last: Exception | None = None
        while True:
            try:
                if self._sock is None:
                    self._connect()
                self._send(line)
                return self._receive()
            except _Lost as e:
                last = e
            except OSError as e:  # refused, reset, unreachable: the service is not (yet) there
                last = e
            self._disconnect()
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.retry_s
            if now >= deadline:
                host, port = self.address
                raise FabricUnavailable(
                    f"the fabric service at {host}:{port} is unavailable after {self.retry_s:g} s: {last}"
                ) from last
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, 0.5)

    def _connect(self) -> None:
        sock = socket.create_connection(self.address, timeout=self.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.answer_timeout_s)
        self.connections += 1
        self._sock, self._rfile = sock, sock.makefile("rb")
        self._send(encode({"op": "hello", "token": self._token, "rank": self.rank}))
        answer = self._receive()
        if not answer.ok:
            self._disconnect()
            raise FabricRefused(answer.error or "refused at hello", answer.kind or "unauthorised", answer)

    def _send(self, line: bytes) -> None:
        assert self._sock is not None
        self._sock.sendall(line)

    def _receive(self) -> Answer:
        assert self._rfile is not None
        try:
            raw = self._rfile.readline(MAX_LINE + 2)
        except TimeoutError:
            self._disconnect()  # the answer may still come: this connection's order is lost
            raise FabricUnavailable(f"no answer from the fabric service within {self.answer_timeout_s:g} s") from None
        if not raw.endswith(b"\n"):
            if len(raw) > MAX_LINE:
                self._disconnect()
                raise FabricRefused(f"an answer longer than {MAX_LINE} bytes", "invalid")
            raise _Lost("the connection ended before the answer")
        try:
            return parse_answer(raw)
        except ProtocolError as e:
            raise FabricRefused(f"an answer the client cannot read: {e}", "invalid") from None

    def _disconnect(self) -> None:
        for closing in (self._rfile, self._sock):
            if closing is not None:
                try:
                    closing.close()
                except OSError:
                    pass
        self._sock = self._rfile = None


__all__ = ["FabricClient", "FabricError", "FabricRefused", "FabricUnavailable", "parse_address"]
