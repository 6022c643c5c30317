"""The fabric service's server: a running job's ranks ask it to set up, prepare or release a configuration.

    service = FabricService(token, allowed={"ring", "torus"}, handler=apply, on_event=record)
    env = service.env()        # TESTBED_FABRIC_SERVICE and TESTBED_FABRIC_TOKEN, for the ranks
    ...
    service.close()

`handler(request)` is called with a `Setup`, `Prepare` or `Release` (its `rank` filled in from the connection's
hello) for a configuration in `allowed` only, and answers by returning (ok) or raising `Refused(reason)`; any
other exception is answered as `failed`, and the service goes on. `on_event(dict)` sees every connection, request
and answer with the rank's clock (`t_job_ns`) and the server's (`time.monotonic_ns`); the token is never in one.
An answer's event is recorded before the answer is sent.

Why threads (socketserver.ThreadingTCPServer) and not asyncio: the handler is blocking by nature (it drives the
switches through the coordinator's dispatcher and waits for light), a connection's requests must be answered in
order anyway, and a job has tens to hundreds of ranks, not thousands. One thread per connection gives the order
for free and lets the handler block; asyncio would have to push every handler call to an executor and back, and
would add a loop the coordinator (which is synchronous) would have to run beside its own work.

Calls to `handler` from different connections run concurrently: the handler must be thread-safe (at a phase
boundary every rank asks for the same configuration at once; coalescing them is the handler's business).
`on_event` is called under one lock, so it need not be.

The service listens where the ranks' hosts reach it (testbed/fabric_service/addresses.py), so anyone on that
network may connect. A connection must say hello with the run's token, as a rank of the job (0 .. world_size - 1),
within `hello_timeout_s`, or it is closed; at most `max_connections` are open at once (more are closed at once,
counted); at most `max_pending_per_peer` from one address have not said hello yet (more from it are closed at once,
counted), so idle connections from a stranger cannot take the places of the job's ranks; a rank is held by one
connection at a time (a new hello as that rank, its client reconnecting, ends the connection that held it); and a
connection that never said a valid hello leaves a trace in the run's history only for the first
`TRACED_UNAUTHORISED` of them (the rest are counted: `refused_counts`), so a stranger cannot fill the history.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hostside.fabric_protocol import (
    ENV_ADDRESS,
    ENV_TOKEN,
    FAILED,
    INVALID,
    MAX_LINE,
    REFUSED,
    UNAUTHORISED,
    Answer,
    ConfigRequest,
    Hello,
    ProtocolError,
    encode,
    parse_request,
)

log = logging.getLogger(__name__)

MAX_ERROR = 2000  # characters of an error answer (a long list of allowed configurations is cut)
HELLO_TIMEOUT_S = 10.0  # a connection that says no valid hello by then is closed: it holds no thread longer
TRACED_UNAUTHORISED = 8  # connections without a valid hello whose events are recorded; the rest are counted
# Connections from one address not past their hello, when the job's size is not known: a host's ranks say hello at
# once on connecting, so only a stranger holds many. Known, it is the job's size (no host has more ranks than that).
PENDING_PER_PEER = 8

Handler = Callable[[ConfigRequest], None]
OnEvent = Callable[[dict[str, Any]], None]


class Refused(Exception):
    """Raised by a handler to refuse a request; the reason goes back to the rank."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a coordinator restarted on the same port must not wait out TIME_WAIT
    daemon_threads = True  # close() shuts the connections down and joins their threads itself
    block_on_close = False

    def __init__(self, address: tuple[str, int], service: FabricService) -> None:
        self.service = service
        super().__init__(address, _Connection)


class _Connection(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.service._serve(self.connection, self.rfile, self.wfile, self.client_address)


class FabricService:
    """Listens on `host:port` (127.0.0.1 and a free port by default) from construction until `close()`."""

    def __init__(
        self,
        token: str,
        allowed: set[str] | frozenset[str],
        handler: Handler,
        on_event: OnEvent | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        world_size: int | None = None,
        max_connections: int = 64,
        max_pending_per_peer: int | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        advertised: dict[str, str] | None = None,
    ) -> None:
        if not token:
            raise ValueError("the fabric service needs a token")
        self._token = token.encode()
        self.allowed = frozenset(allowed)
        self.world_size = world_size  # a hello claims a rank of the job: 0 .. world_size - 1
        self.max_connections = max_connections
        self.max_pending_per_peer = max_pending_per_peer or world_size or PENDING_PER_PEER
        self._pending: dict[str, int] = {}  # peer address -> its connections not past their hello
        self._rank_holders: dict[int, int] = {}  # rank -> the connection that holds it
        self._taken_over: dict[int, int] = {}  # connection -> the one that took its rank over
        self.hello_timeout_s = hello_timeout_s
        self.advertised = advertised or {}  # host -> the address that host reaches the service at
        self._traced_unauthorised = 0
        # Recorded at the service's stop (fabric_service.stop): over_limit counts both limits on connections.
        self.refused_counts = {"over_limit": 0, "untraced_unauthorised": 0}
        self._handler = handler
        self._on_event = on_event
        self._event_lock = threading.Lock()
        self._conn_lock = threading.Lock()
        self._connections: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._server = _Server((host, port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fabric-service", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the service listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def env(self, host: str | None = None) -> dict[str, str]:
        """What the environment of a rank on `host` needs for `FabricClient()` to find this service: the address
        that host reaches it at (the one it listens on, when that is one address).
        """
        bound, port = self.address
        where = self.advertised.get(host, bound) if host is not None else bound
        if where in ("0.0.0.0", "::"):  # noqa: S104 - listening on every address: no host was told which
            raise ValueError(f"the fabric service listens on every address: which one does {host} reach?")
        return {
            ENV_ADDRESS: f"[{where}]:{port}" if ":" in where else f"{where}:{port}",
            ENV_TOKEN: self._token.decode(),
        }

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop listening, end every connection (a rank's client sees a reset and reconnects to whatever serves
        next) and wait up to `timeout_s` for their threads (a handler call under way is waited for).
        """
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        with self._conn_lock:
            connections = list(self._connections.values())
        for conn, _ in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FabricService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one connection, in its own thread ----------------------------------------------------------------------

    def _serve(self, conn: socket.socket, rfile: Any, wfile: Any, peer: tuple[str, int]) -> None:
        with self._conn_lock:
            if self._closed:
                return
            if len(self._connections) >= self.max_connections:
                self.refused_counts["over_limit"] += 1
                return  # closed by socketserver once this returns; nothing recorded
            if self._pending.get(peer[0], 0) >= self.max_pending_per_peer:
                self.refused_counts["over_limit"] += 1
                return  # likewise
            self._pending[peer[0]] = self._pending.get(peer[0], 0) + 1
            number = next(self._ids)
            self._connections[number] = (conn, threading.current_thread())
        # Until its hello is valid a connection's events are held back (a stranger's may never be recorded).
        state: dict[str, Any] = {"conn": number, "rank": None, "held": [], "peer": peer[0], "pending": True}
        # Set before the deadline shuts the connection: the reader, woken by that shutdown, knows why it ended
        # (the timer's thread may not have returned yet, so whether it is alive says nothing).
        deadline_passed = threading.Event()
        hello_deadline = threading.Timer(self.hello_timeout_s, _shut_at_deadline, (conn, deadline_passed))
        hello_deadline.daemon = True
        hello_deadline.start()
        state["deadline"] = hello_deadline
        self._event({"event": "fabric_service.connect", "conn": number, "peer": f"{peer[0]}:{peer[1]}"}, state)
        reason = "closed by the rank"
        try:
            while True:
                line = rfile.readline(MAX_LINE + 2)  # the longest line, "\r\n" included
                t_received = time.monotonic_ns()
                if not line:
                    reason = "closed by the service" if self._closed else "closed by the rank"
                    break
                if not line.endswith(b"\n"):
                    if len(line) <= MAX_LINE:
                        reason = "the rank closed its connection mid-line"
                        break
                    # The framing is lost (the rest of the line would be read as the next one): answer and close.
                    error = f"a line longer than {MAX_LINE} bytes"
                    self._leave_pending(state)
                    self._answer(wfile, state, None, Answer(None, False, t_received, error=error, kind=INVALID))
                    reason = error
                    break
                if not self._one_line(wfile, state, line, t_received):
                    reason = "refused at hello"
                    break
        except OSError as e:
            reason = f"connection lost: {e}"
        finally:
            hello_deadline.cancel()
            if state["rank"] is None and deadline_passed.is_set() and reason == "closed by the rank":
                reason = f"no valid hello within {self.hello_timeout_s:g} s"
            with self._conn_lock:
                self._end_pending(state)
                if self._rank_holders.get(state["rank"]) == number:
                    del self._rank_holders[state["rank"]]
                successor = self._taken_over.pop(number, None)
            if successor is not None:
                reason = f"rank {state['rank']} was taken over by connection {successor} (its hello as that rank)"
            self._event(
                {"event": "fabric_service.disconnect", "conn": number, "rank": state["rank"], "reason": reason}, state
            )
            self._end_unauthorised(state)
            with self._conn_lock:
                self._connections.pop(number, None)

    def _one_line(self, wfile: Any, state: dict[str, Any], line: bytes, t_received: int) -> bool:
        """Answer one line; False when the connection is to be closed."""
        try:
            request = parse_request(line)
        except ProtocolError as e:
            self._request_event(state, None, t_received, invalid=str(e))
            if state["rank"] is None:  # nothing but a valid hello may open a connection
                self._leave_pending(state)
                answer = Answer(e.id, False, t_received, error=f"hello first: {e}", kind=UNAUTHORISED)
                self._answer(wfile, state, None, answer)
                return False
            self._answer(wfile, state, None, Answer(e.id, False, t_received, error=str(e), kind=INVALID))
            return True
        self._request_event(state, request, t_received)
        if isinstance(request, Hello):
            if state["rank"] is not None:
                error = f"hello again (this connection is rank {state['rank']}'s)"
                self._answer(wfile, state, request, Answer(None, False, t_received, error=error, kind=INVALID))
                return True
            if not hmac.compare_digest(request.token.encode(), self._token):
                error = "wrong token: this is not the fabric service of your run"
                self._leave_pending(state)
                self._answer(wfile, state, request, Answer(None, False, t_received, error=error, kind=UNAUTHORISED))
                return False
            if self.world_size is not None and not 0 <= request.rank < self.world_size:
                error = f"rank {request.rank} is not a rank of this job (0 .. {self.world_size - 1})"
                self._leave_pending(state)
                self._answer(wfile, state, request, Answer(None, False, t_received, error=error, kind=INVALID))
                return False
            state["deadline"].cancel()
            state["rank"] = request.rank
            self._hold_rank(state)
            self._release_held(state)
            self._answer(wfile, state, request, Answer(None, True, t_received))
            return True
        if state["rank"] is None:
            error = f"hello first: {request.op} before hello"
            self._leave_pending(state)
            self._answer(wfile, state, request, Answer(request.id, False, t_received, error=error, kind=UNAUTHORISED))
            return False
        assert isinstance(request, ConfigRequest)
        self._answer(wfile, state, request, self._decide(request, state["rank"], t_received))
        return True

    def _leave_pending(self, state: dict[str, Any]) -> None:
        """A connection closed at its hello: it stops counting against its address before its answer is sent, so
        a client told no may connect again at once.
        """
        with self._conn_lock:
            self._end_pending(state)

    def _end_pending(self, state: dict[str, Any]) -> None:
        """The connection is no longer one not past its hello (under _conn_lock)."""
        if state["pending"]:
            state["pending"] = False
            left = self._pending[state["peer"]] - 1
            if left:
                self._pending[state["peer"]] = left
            else:
                del self._pending[state["peer"]]

    def _hold_rank(self, state: dict[str, Any]) -> None:
        """A valid hello: the connection holds its rank, alone; one that held it before (its client gone, or a
        second client claiming the rank) is ended.
        """
        number, rank = state["conn"], state["rank"]
        with self._conn_lock:
            self._end_pending(state)
            before = self._rank_holders.get(rank)
            self._rank_holders[rank] = number
            held = None
            if before is not None and before in self._connections:
                held = self._connections[before]
                self._taken_over[before] = number
        if held is not None:
            _shut(held[0])

    def _decide(self, request: ConfigRequest, rank: int, t_received: int) -> Answer:
        if request.config not in self.allowed:
            allows = ", ".join(sorted(self.allowed)) or "none"
            error = f"configuration {request.config!r} is not one this playbook allows: {allows}"
            return Answer(request.id, False, t_received, error=error, kind=REFUSED)
        try:
            self._handler(replace(request, rank=rank, t_received_ns=t_received))
        except Refused as e:
            return Answer(request.id, False, t_received, error=e.reason or "refused", kind=REFUSED)
        except Exception as e:  # a handler's bug or a device's failure is the rank's answer, not the service's end
            log.exception("fabric service: the handler failed on %s of %r", request.op, request.config)
            return Answer(request.id, False, t_received, error=f"{type(e).__name__}: {e}", kind=FAILED)
        return Answer(request.id, True, t_received)

    def _answer(self, wfile: Any, state: dict[str, Any], request: Any, answer: Answer) -> None:
        if answer.error is not None and len(answer.error) > MAX_ERROR:
            answer = replace(answer, error=answer.error[: MAX_ERROR - 3] + "...")
        answer = replace(answer, t_answered_ns=time.monotonic_ns())
        line = encode(answer.to_wire())
        # Recorded before it leaves: a rank never holds an answer the run's record lacks.
        event: dict[str, Any] = {"event": "fabric_service.answer", "conn": state["conn"], "rank": state["rank"]}
        event |= _request_fields(request)
        event |= answer.to_wire()
        self._event(event, state)
        wfile.write(line)
        wfile.flush()

    def _request_event(
        self, state: dict[str, Any], request: Any, t_received: int, *, invalid: str | None = None
    ) -> None:
        event: dict[str, Any] = {"event": "fabric_service.request", "conn": state["conn"], "rank": state["rank"]}
        event |= _request_fields(request)
        event["t_server_ns"] = t_received
        if invalid is not None:
            event["invalid"] = invalid
        self._event(event, state)

    def _event(self, event: dict[str, Any], state: dict[str, Any] | None = None) -> None:
        """Record an event; a connection's are held back until its hello is valid."""
        if state is not None and state["held"] is not None:
            state["held"].append(event)
            return
        if self._on_event is None:
            return
        with self._event_lock:
            try:
                self._on_event(event)
            except Exception:  # a recorder's failure must not end a rank's connection
                log.exception("fabric service: on_event failed on %s", event.get("event"))

    def _release_held(self, state: dict[str, Any]) -> None:
        """A valid hello: what the connection did before it is recorded now, in order."""
        held, state["held"] = state["held"], None
        for event in held:
            self._event(event)

    def _end_unauthorised(self, state: dict[str, Any]) -> None:
        """A connection that ended without a valid hello: its events recorded while few such have come, else
        counted.
        """
        if state["held"] is None:
            return
        with self._conn_lock:
            traced = self._traced_unauthorised < TRACED_UNAUTHORISED
            self._traced_unauthorised += 1
            if not traced:
                self.refused_counts["untraced_unauthorised"] += 1
        if traced:
            self._release_held(state)
        state["held"] = None


def _shut_at_deadline(conn: socket.socket, passed: threading.Event) -> None:
    """The hello deadline: noted, then the connection shut."""
    passed.set()
    _shut(conn)


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)  # the connection's reader returns at once, and the connection ends
    except OSError:
        pass


def _request_fields(request: Any) -> dict[str, Any]:
    if isinstance(request, Hello):
        return {"op": "hello", "hello_rank": request.rank}  # never the token
    if isinstance(request, ConfigRequest):
        return {"op": request.op, "config": request.config, "id": request.id, "t_job_ns": request.t_job_ns}
    return {"op": None}
