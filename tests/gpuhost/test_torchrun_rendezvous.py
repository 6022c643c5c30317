"""The emulated host's torchrun, its rendezvous (emulators/gpuhost/torchrun/rendezvous.py): launchers meeting over
real TCP, each in a thread of its own here; the static backend ranking nodes by --node-rank, c10d by (address,
pid); and the store refusing what a real one would (another run, a node rank twice, a late node, too few nodes).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from emulators.gpuhost.torchrun.options import Config, parse_args
from emulators.gpuhost.torchrun.rendezvous import Assignment, RendezvousError, rendezvous

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int, *options: str, nnodes: int = 2, timeout_s: float = 20.0) -> Config:
    return parse_args(
        [
            *("--nnodes", str(nnodes), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "run-1"),
            *("--rdzv-conf", f"timeout={timeout_s},join_timeout={timeout_s}", *options, "prog"),
        ]
    )


class Launchers:
    """Launchers meeting in threads of this process, as separate hosts' launchers meet over TCP."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.kept: list[socket.socket] = []  # what the rendezvous keep open while their jobs would run

    def meet(self, cfg: Config) -> Future[tuple[Assignment, list[socket.socket]]]:
        return self.pool.submit(self._meet, cfg)

    def _meet(self, cfg: Config) -> tuple[Assignment, list[socket.socket]]:
        keep: list[socket.socket] = []
        try:
            return rendezvous(cfg, keep), keep
        finally:
            self.kept.extend(keep)


@pytest.fixture
def launchers() -> Iterator[Launchers]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        group = Launchers(pool)
        yield group
    for s in group.kept:
        s.close()


def test_static_nodes_are_ranked_by_node_rank_and_bootstrap_from_the_endpoint(launchers):
    port = free_port()
    # node 1 comes first: it retries until node 0's store listens
    second = launchers.meet(config(port, "--node-rank", "1", "--nproc-per-node", "3"))
    first = launchers.meet(config(port, "--node-rank", "0", "--nproc-per-node", "2"))
    a0, keep0 = first.result(timeout=30)
    a1, _ = second.result(timeout=30)
    assert a0 == Assignment(0, 2, 0, 5, "127.0.0.1", port)
    assert a1 == Assignment(1, 2, 2, 5, "127.0.0.1", port)
    assert keep0[0].getsockname()[1] == port  # node 0 keeps the store listening while its job runs


def test_c10d_ranks_nodes_by_address_and_node_0_holds_master_port(launchers):
    port = free_port()
    # --node-rank is ignored by c10d: the node on 127.0.0.1 sorts first whatever it says
    high = launchers.meet(config(port, "--rdzv-backend", "c10d", "--local-addr", "127.0.0.2", "--node-rank", "0"))
    low = launchers.meet(config(port, "--rdzv-backend", "c10d", "--local-addr", "127.0.0.1", "--node-rank", "1"))
    a_low, keep_low = low.result(timeout=30)
    a_high, _ = high.result(timeout=30)
    assert (a_low.group_rank, a_high.group_rank) == (0, 1)
    assert (a_low.base_rank, a_high.base_rank, a_low.world_size) == (0, 1, 2)
    holder = keep_low[0].getsockname()
    assert a_low.master_addr == a_high.master_addr == "127.0.0.1"
    assert a_low.master_port == a_high.master_port == holder[1] != port


def test_a_node_of_another_run_is_refused_and_the_store_times_out_waiting(launchers):
    port = free_port()
    host = launchers.meet(config(port, "--node-rank", "0", timeout_s=1.0))
    stranger = dataclasses.replace(config(port, "--node-rank", "1"), run_id="run-2")
    with pytest.raises(RendezvousError, match=r"a node of rendezvous 'run-2' \(static\) came to this store of 'run-1'"):
        launchers.meet(stranger).result(timeout=30)
    with pytest.raises(RendezvousError, match=r"Timed out after 1 seconds waiting for clients\. 1/2 clients joined\."):
        host.result(timeout=30)


def test_a_node_rank_joining_twice_is_refused(launchers):
    port = free_port()
    node0 = launchers.meet(config(port, "--node-rank", "0", nnodes=3, timeout_s=3.0))
    twins = [launchers.meet(config(port, "--node-rank", "1", nnodes=3, timeout_s=3.0)) for _ in range(2)]
    errors = []
    for f in twins:
        with pytest.raises(RendezvousError) as refused:
            f.result(timeout=30)
        errors.append(str(refused.value))
    # whichever came second was refused; the first waited with node 0 for a third node that never came
    assert sorted("twice" in e for e in errors) == [False, True]
    assert any("node rank 1 joined the rendezvous 'run-1' twice" in e for e in errors)
    assert any("2/3 clients joined" in e for e in errors)
    with pytest.raises(RendezvousError, match="2/3 clients joined"):
        node0.result(timeout=30)


def test_a_node_coming_after_the_rendezvous_completed_is_not_admitted(launchers):
    port = free_port()
    alone = config(port, "--node-rank", "0", nnodes=1)
    assert launchers.meet(alone).result(timeout=30)[0] == Assignment(0, 1, 0, 1, "127.0.0.1", port)
    late = dataclasses.replace(alone, node_rank=1)
    with pytest.raises(RendezvousError, match="is complete: a late node was not admitted"):
        launchers.meet(late).result(timeout=30)


def test_a_store_that_cannot_listen_fails_the_rendezvous(launchers):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RendezvousError, match=f"failed to listen on 127.0.0.1:{port}"):
            launchers.meet(config(port, "--node-rank", "0", nnodes=1)).result(timeout=30)


def test_no_store_at_the_endpoint_times_the_client_out(launchers):
    port = free_port()  # nobody listens there
    with pytest.raises(RendezvousError, match="The client socket has timed out after 0.3 seconds"):
        launchers.meet(config(port, "--node-rank", "1", timeout_s=0.3)).result(timeout=30)
