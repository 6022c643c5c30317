"""The fabric service as a lab's network sees it: it listens, and tells each rank's host, an address that host
reaches (never 127.0.0.1 for a host elsewhere); it holds no thread for a connection that says no valid hello; it
takes a bounded number of connections; a stranger's connections leave a bounded trace in the run's history; and a
token holder may claim only a rank of the job.
"""

from __future__ import annotations

import json
import select
import socket

from test_fabric_service import TOKEN, Recorder

from hostside.fabric_protocol import ENV_ADDRESS, encode
from testbed.fabric_service.addresses import service_addresses, source_address
from testbed.fabric_service.server import TRACED_UNAUTHORISED, FabricService


def hello(service: FabricService, rank: int, token: str = TOKEN) -> tuple[socket.socket, dict]:
    sock = socket.create_connection(service.address, timeout=5)
    sock.sendall(encode({"op": "hello", "token": token, "rank": rank}))
    line = sock.makefile("rb").readline()
    return sock, (json.loads(line) if line else {})


def test_each_host_is_told_the_address_it_reaches_the_service_at():
    listen, told = service_addresses({"gpu01": "127.0.0.1", "gpu02": "localhost"})
    assert listen == "127.0.0.1" and told == {"gpu01": "127.0.0.1", "gpu02": "127.0.0.1"}  # the twin on loopback
    elsewhere = source_address("192.0.2.1")  # a host on another network: the address this machine leaves by
    assert not elsewhere.startswith("127.")
    listen, told = service_addresses({"gpu01": "192.0.2.1", "gpu02": "127.0.0.1"})
    assert listen == "0.0.0.0" and told == {"gpu01": elsewhere, "gpu02": "127.0.0.1"}  # noqa: S104
    assert service_addresses({"gpu01": "192.0.2.1"}, "10.1.2.3") == ("10.1.2.3", {"gpu01": "10.1.2.3"})


def test_a_rank_on_another_network_is_never_told_127_0_0_1():
    recorder = Recorder()
    listen, told = service_addresses({"gpu01": "192.0.2.1", "local": "127.0.0.1"})
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, host=listen, advertised=told) as s:
        port = s.address[1]
        assert s.env("gpu01")[ENV_ADDRESS] == f"{told['gpu01']}:{port}"
        assert s.env("local")[ENV_ADDRESS] == f"127.0.0.1:{port}"
        sock, answer = hello(s, 0)  # and it does listen on every address it told
        assert answer["ok"] is True
        sock.close()


def test_a_claim_of_a_rank_outside_the_job_is_refused():
    recorder = Recorder()
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, world_size=4) as s:
        sock, answer = hello(s, 4)
        assert answer["ok"] is False and "rank 4 is not a rank of this job (0 .. 3)" in answer["error"]
        assert sock.makefile("rb").readline() == b""  # and closed
        sock.close()
        sock, answer = hello(s, 3)
        assert answer["ok"] is True
        sock.close()


def test_a_connection_that_says_nothing_is_closed_at_the_hello_deadline():
    recorder = Recorder()
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, hello_timeout_s=0.5) as s:
        sock = socket.create_connection(s.address, timeout=5)
        assert sock.makefile("rb").readline() == b""  # the service closed it; the test's read did not time out
        events = recorder.wait_for(lambda ev: any(e["event"] == "fabric_service.disconnect" for e in ev))
        (gone,) = [e for e in events if e["event"] == "fabric_service.disconnect"]
        assert gone["reason"] == "no valid hello within 0.5 s" and gone["rank"] is None
        sock.close()


def test_connections_beyond_the_limit_are_closed_at_once_and_counted():
    recorder = Recorder()
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, max_connections=2) as s:
        ranks = [hello(s, r)[0] for r in (0, 1)]
        extra = socket.create_connection(s.address, timeout=5)
        assert extra.makefile("rb").readline() == b""
        extra.close()
        assert s.refused_counts["over_limit"] == 1
        assert len(recorder.of("connect")) == 2  # the third left no trace
        for sock in ranks:
            sock.close()


def test_strangers_leave_a_bounded_trace_and_ranks_a_full_one():
    recorder = Recorder()
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event) as s:
        for _ in range(TRACED_UNAUTHORISED + 12):
            sock, answer = hello(s, 0, token="guess")
            assert answer["ok"] is False
            sock.close()
        sock, answer = hello(s, 0)
        assert answer["ok"] is True
        sock.close()
        recorder.wait_for(lambda ev: sum(e["event"] == "fabric_service.disconnect" for e in ev) >= 9)
    connects = recorder.of("connect")
    assert len(connects) == TRACED_UNAUTHORISED + 1  # the first strangers, and the rank
    assert s.refused_counts["untraced_unauthorised"] == 12
    ok = [e for e in recorder.of("answer") if e.get("ok")]
    assert [e["hello_rank"] for e in ok] == [0]  # the rank's hello, recorded in full


def test_idle_strangers_from_one_address_cannot_take_the_places_of_the_job_s_ranks():
    """A stranger opens 200 connections from one address and says nothing: at most the job's size of them are held
    (no host has more ranks), the rest closed at once; every one of the 36 ranks still gets in.
    """
    ranks = 36
    recorder = Recorder()
    # As testbed/fabric_service/serving.py makes it for a job of 36 ranks; the stranger's connections stay for the
    # whole test unless the limit closes them.
    limits = {"world_size": ranks, "max_connections": 2 * ranks + 16, "hello_timeout_s": 120}
    service = FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, **limits)
    with service as s:
        elsewhere = ("127.0.0.2", 0)  # another address than the ranks'
        stranger = [socket.create_connection(s.address, timeout=5, source_address=elsewhere) for _ in range(200)]
        closed = 0
        while closed < 200 - ranks:  # the closed ones become readable (EOF); the held ones never do
            readable, _, _ = select.select(stranger, [], [], 10)
            assert readable, f"only {closed} of the stranger's connections were closed"
            for sock in readable:
                assert sock.recv(1) == b""
                stranger.remove(sock)
                sock.close()
                closed += 1
        assert s.refused_counts["over_limit"] == 200 - ranks and len(stranger) == ranks
        held = [hello(s, rank) for rank in range(ranks)]
        assert all(answer["ok"] for _, answer in held)
        for sock in stranger + [sock for sock, _ in held]:
            sock.close()


def test_one_connection_holds_a_rank_at_a_time():
    """A second hello as rank 3 (its client reconnecting, or another claiming it): the connection that held the rank
    is ended, saying why, and rank 3's requests come from the new one alone.
    """
    recorder = Recorder()
    with FabricService(TOKEN, {"ring"}, recorder.handler, recorder.on_event, world_size=4) as s:
        first, answer = hello(s, 3)
        assert answer["ok"] is True
        second, answer = hello(s, 3)
        assert answer["ok"] is True
        assert first.makefile("rb").readline() == b""  # ended by the service
        second.sendall(encode({"op": "setup", "config": "ring", "id": 1, "t_job_ns": 5}))
        assert json.loads(second.makefile("rb").readline())["ok"] is True
        events = recorder.wait_for(lambda ev: any(e["event"] == "fabric_service.disconnect" for e in ev))
        (gone,) = [e for e in events if e["event"] == "fabric_service.disconnect"]
        taken = [e["conn"] for e in recorder.of("connect")]
        assert gone["conn"] == taken[0]
        assert gone["reason"] == f"rank 3 was taken over by connection {taken[1]} (its hello as that rank)"
        assert [(r.rank, r.config) for r in recorder.requests] == [(3, "ring")]
        first.close()
        second.close()
