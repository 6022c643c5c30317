"""The fabric service and its client over real sockets and threads: no mock of our code, no sleep standing in for
synchronisation (a test waits on the service's own events, with a deadline).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hostside.fabric_client import FabricClient, FabricRefused, FabricUnavailable
from hostside.fabric_protocol import MAX_LINE, ConfigRequest, Setup, encode
from testbed.fabric_service.server import FabricService, Refused

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-run-token"
ALLOWED = {"ring", "mesh"}


class Recorder:
    """The handler and the event sink of one service: what it was asked, what it recorded."""

    def __init__(self, refuse: dict[str, str] | None = None) -> None:
        self.requests: list[ConfigRequest] = []
        self.events: list[dict] = []
        self.refuse = refuse or {}
        self._changed = threading.Condition()

    def handler(self, request: ConfigRequest) -> None:
        if request.config in self.refuse:
            raise Refused(self.refuse[request.config])
        if request.config == "boom":
            raise RuntimeError("the switch caught fire")
        with self._changed:
            self.requests.append(request)

    def on_event(self, event: dict) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = 5.0) -> list[dict]:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.events), timeout), self.events
            return list(self.events)

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == f"fabric_service.{name}"]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder(refuse={"mesh": "mesh is held by the failover drill"})


@pytest.fixture
def service(recorder):
    with FabricService(TOKEN, ALLOWED | {"boom"}, recorder.handler, recorder.on_event) as running:
        yield running


def client_of(service: FabricService, rank: int = 3, **kwargs) -> FabricClient:
    kwargs.setdefault("retry_s", 5.0)
    return FabricClient(service.address, TOKEN, rank, **kwargs)


def raw(service: FabricService) -> tuple[socket.socket, object]:
    sock = socket.create_connection(service.address, timeout=5)
    return sock, sock.makefile("rb")


def answer_of(rfile) -> dict:
    return json.loads(rfile.readline())


def test_a_rank_s_setup_reaches_the_handler_and_is_answered(service, recorder):
    with client_of(service, rank=3) as client:
        answer = client.setup("ring")
        assert answer.ok and answer.id == "3-1"
        assert answer.t_received_ns <= answer.t_answered_ns
        client.prepare("ring")
        client.release("ring")
    assert [(type(r).__name__, r.config, r.rank, r.id) for r in recorder.requests] == [
        ("Setup", "ring", 3, "3-1"),
        ("Prepare", "ring", 3, "3-2"),
        ("Release", "ring", 3, "3-3"),
    ]
    assert all(r.t_job_ns > 0 for r in recorder.requests)


def test_a_configuration_the_playbook_does_not_allow_is_refused_and_recorded(service, recorder):
    with client_of(service) as client, pytest.raises(FabricRefused) as refused:
        client.setup("torus")
    assert refused.value.kind == "refused"
    assert str(refused.value) == "configuration 'torus' is not one this playbook allows: boom, mesh, ring"
    assert recorder.requests == []  # the handler was never asked
    [request] = [e for e in recorder.of("request") if e["op"] == "setup"]
    [answer] = [e for e in recorder.of("answer") if e["op"] == "setup"]
    assert request["config"] == answer["config"] == "torus"
    assert answer["ok"] is False and answer["kind"] == "refused" and "torus" in answer["error"]


def test_the_handler_s_refusal_reaches_the_rank_with_its_reason(service, recorder):
    with client_of(service) as client:
        with pytest.raises(FabricRefused, match="mesh is held by the failover drill") as refused:
            client.setup("mesh")
        assert refused.value.kind == "refused"
        with pytest.raises(FabricRefused, match="RuntimeError: the switch caught fire") as failed:
            client.setup("boom")
        assert failed.value.kind == "failed"
        assert client.setup("ring").ok  # the same connection goes on
        assert client.connections == 1


def test_a_wrong_token_is_refused_and_the_connection_closed(service, recorder):
    with FabricClient(service.address, "not-the-token", 0, retry_s=5) as client, pytest.raises(FabricRefused) as e:
        client.setup("ring")
    assert e.value.kind == "unauthorised" and "wrong token" in str(e.value)
    assert client.connections == 1  # a refusal is not retried
    assert recorder.requests == []

    sock, rfile = raw(service)
    with sock:
        sock.sendall(encode({"op": "hello", "token": "guess", "rank": 1}))
        answer = answer_of(rfile)
        assert (answer["ok"], answer["kind"]) == (False, "unauthorised")
        assert rfile.readline() == b""  # closed by the service
    recorder.wait_for(lambda events: sum(e["event"] == "fabric_service.disconnect" for e in events) == 2)
    assert "guess" not in repr(recorder.events) and "not-the-token" not in repr(recorder.events)


def test_a_request_before_hello_is_refused_and_the_connection_closed(service, recorder):
    sock, rfile = raw(service)
    with sock:
        sock.sendall(encode(Setup("setup", "ring", 1, 5).to_wire()))
        answer = answer_of(rfile)
        assert (answer["id"], answer["ok"], answer["kind"]) == (1, False, "unauthorised")
        assert rfile.readline() == b""
    assert recorder.requests == []


def test_a_connection_s_requests_are_answered_in_order_and_a_bad_line_does_not_end_it(service, recorder):
    sock, rfile = raw(service)
    with sock:
        lines = [
            encode({"op": "hello", "token": TOKEN, "rank": 7}),
            encode({"op": "setup", "config": "ring", "id": "a", "t_job_ns": 1}),
            b'{"op": "setup", "config": "ring"}\n',
            b"\xff not json\n",
            encode({"op": "prepare", "config": "torus", "id": "b"}),
            encode({"op": "release", "config": "ring", "id": "c", "t_job_ns": 2}),
        ]
        sock.sendall(b"".join(lines))  # pipelined: all sent before any answer is read
        answers = [answer_of(rfile) for _ in lines]
    assert [(a["id"], a["ok"], a.get("kind")) for a in answers] == [
        (None, True, None),
        ("a", True, None),
        (None, False, "invalid"),
        (None, False, "invalid"),
        ("b", False, "refused"),
        ("c", True, None),
    ]
    assert "missing 'id', 't_job_ns'" in answers[2]["error"]
    assert [(r.op, r.id, r.rank) for r in recorder.requests] == [("setup", "a", 7), ("release", "c", 7)]


def test_an_overlong_line_is_answered_and_the_connection_closed(service):
    sock, rfile = raw(service)
    with sock:
        sock.sendall(encode({"op": "hello", "token": TOKEN, "rank": 0}))
        assert answer_of(rfile)["ok"]
        sock.sendall(b"x" * (MAX_LINE + 10) + b"\n")
        answer = answer_of(rfile)
        assert (answer["ok"], answer["kind"]) == (False, "invalid") and str(MAX_LINE) in answer["error"]
        assert rfile.readline() == b""


def test_the_events_carry_the_job_s_clock_and_the_server_s(service, recorder):
    with client_of(service, rank=2) as client:
        answer = client.setup("ring", t_job_ns=1_718_000_000_123_456_789)
    [request] = [e for e in recorder.of("request") if e["op"] == "setup"]
    [answered] = [e for e in recorder.of("answer") if e["op"] == "setup"]
    assert request["t_job_ns"] == answered["t_job_ns"] == 1_718_000_000_123_456_789
    assert request["t_server_ns"] == answered["t_received_ns"] == answer.t_received_ns
    assert answered["t_answered_ns"] == answer.t_answered_ns >= answer.t_received_ns
    assert request["rank"] == answered["rank"] == 2 and answered["id"] == "2-1"
    hello = [e for e in recorder.of("answer") if e["op"] == "hello"]
    assert hello[0]["ok"] and hello[0]["hello_rank"] == 2 and "token" not in hello[0]


def test_a_client_reconnects_to_a_service_restarted_on_the_same_port(recorder):
    first = FabricService(TOKEN, ALLOWED, recorder.handler, recorder.on_event)
    host, port = first.address
    client = client_of(first, rank=5)
    try:
        assert client.setup("ring").ok
        first.close()  # the coordinator goes away; the client's connection is closed under it
        second_recorder = Recorder()
        with FabricService(TOKEN, ALLOWED, second_recorder.handler, port=port) as second:
            assert second.address == (host, port)
            assert client.setup("ring").ok
            assert [(r.config, r.rank) for r in second_recorder.requests] == [("ring", 5)]
        assert client.connections == 2

        # Restarted while the client is already trying: whichever comes first, the call gets through.
        outcome: list = []
        caller = threading.Thread(target=lambda: outcome.append(client.setup("ring")))
        caller.start()
        with FabricService(TOKEN, ALLOWED, second_recorder.handler, port=port):
            caller.join(10)
        assert not caller.is_alive() and outcome[0].ok
        assert client.connections == 3
    finally:
        client.close()
        first.close()


def test_a_service_that_stays_away_is_unavailable_after_the_retry_budget():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = probe.getsockname()
    with FabricClient(address, TOKEN, 0, retry_s=0.3) as client, pytest.raises(FabricUnavailable, match="0.3 s"):
        client.setup("ring")


def test_the_client_reads_its_address_and_token_from_the_environment(service, monkeypatch):
    for key, value in service.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "4")
    with FabricClient() as client:
        assert client.rank == 4 and client.address == service.address
        assert client.setup("ring").id == "4-1"
    monkeypatch.delenv("TESTBED_FABRIC_SERVICE")
    with pytest.raises(FabricUnavailable, match="TESTBED_FABRIC_SERVICE"):
        FabricClient()


def test_many_ranks_at_once(service, recorder):
    def rank(n: int) -> None:
        with client_of(service, rank=n) as client:
            for _ in range(5):
                client.setup("ring")

    threads = [threading.Thread(target=rank, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(recorder.requests) == 80
    for n in range(16):  # each connection's in order
        assert [r.id for r in recorder.requests if r.rank == n] == [f"{n}-{i}" for i in range(1, 6)]


def test_importing_the_client_is_cheap():
    probe = (
        "import sys\n"
        "import hostside.fabric_client\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('testbed', 'ray', 'pydantic', 'emulators')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[]"
