"""One launch's addresses: where each rank listens, where the rendezvous is, and each rank's view of every
rank's address (TESTBED_PEERS). Computed from the ranks, their listen ports and the job's fabric alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from testbed.config.sections import JobFabric
from testbed.engine.job.ranks import Rank, ranks_per_host
from testbed.fabric.jobfabric import ring_link_ports

# (src host, src port, dst host, dst port, target port) -> the address that reaches the target through the twin's
# data plane: a relay that carries traffic only while the switches hold a circuit between the two host ports.
RelayLink = Callable[[str, str, str, str, int], str]


@dataclass(frozen=True)
class Layout:
    ranks: list[Rank]
    ports: list[int]  # rank -> its listen port
    master_port: int  # rank 0's rendezvous port (MASTER_PORT)
    direct: list[str]  # rank -> host address:port, reached straight (a lab's routing decides the path)
    master_address: str  # rank 0's host's address: the rendezvous
    fabric: JobFabric | None = None
    link: RelayLink | None = None  # None: every rank is reached directly (a lab)

    @classmethod
    def of(
        cls,
        ranks: list[Rank],
        listen: list[int],
        address_of: Callable[[str], str],
        *,
        fabric: JobFabric | None = None,
        link: RelayLink | None = None,
        rendezvous_of: Callable[[str], str] | None = None,
    ) -> Layout:
        """The layout of `ranks` listening on `listen` (one port per rank, then the rendezvous port), each host's
        ranks reached at address_of(host), its rendezvous at rendezvous_of(host) (default: the same).
        """
        *ports, master_port = listen
        direct = [f"{address_of(r.host)}:{ports[r.index]}" for r in ranks]
        # PyTorch's contract (torch.distributed's env:// rendezvous): rank 0's host serves the rendezvous, so
        # after a failover of rank 0 it is the spare's address the ranks are given.
        master = (rendezvous_of or address_of)(ranks[0].host)
        return cls(ranks, ports, master_port, direct, master, fabric, link)

    @property
    def master(self) -> str:
        """Rank 0's host, which serves the rendezvous."""
        return self.ranks[0].host

    @property
    def per_host(self) -> dict[str, int]:
        return ranks_per_host(self.ranks)

    def peers_of(self, r: Rank) -> list[str]:
        """Rank r's view of every rank's address. Through the twin's data plane, the neighbour it connects to
        (the next rank) is reached by a relay that carries traffic only while the duplex link between the
        two hosts is lit, so a broken or wrongly rewired fabric really stops the job.
        """
        peers = list(self.direct)
        if self.link is None or self.fabric is None or len(self.ranks) < 2:
            return peers
        # The duplex link that carries rank r -> r+1: on a torus, the x or y link between them.
        ports = ring_link_ports(self.fabric, r.index)
        nxt = self.ranks[(r.index + 1) % len(self.ranks)]
        if ports is not None and nxt.host != r.host:
            peers[nxt.index] = self.link(r.host, ports[0], nxt.host, ports[1], self.ports[nxt.index])
        return peers

    def host_peers(self, host: str) -> list[str]:
        """TESTBED_PEERS for every rank on `host` at once (torchrun gives its workers one environment): each
        of its ranks' own view merged. A rank uses only its own entry and its neighbour's, and the neighbour
        it reaches through a relay runs on another host, so the views do not conflict.
        """
        peers = list(self.direct)
        for r in self.ranks:
            if r.host == host:
                nxt = (r.index + 1) % len(self.ranks)
                peers[nxt] = self.peers_of(r)[nxt]
        return peers
