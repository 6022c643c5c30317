"""Where a launch's ranks listen and how each reaches the others: the ranks of an assignment, the lab's and the
twin's listen ports, the rendezvous on rank 0's host, and each rank's TESTBED_PEERS (direct, or its ring
neighbour through the twin's relay when the job has a duplex fabric).
"""

from __future__ import annotations

import random
import socket

from testbed.config.sections import JobFabric
from testbed.engine.job.layout import Layout
from testbed.engine.job.ports import ephemeral_low, free_ports, lab_ports
from testbed.engine.job.ranks import Rank, ranks_of, ranks_per_host

ADDRESSES = {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2", "gpu03": "10.0.0.3", "gpu04": "10.0.0.4", "gpu09": "10.0.0.9"}
DUPLEX_RING = JobFabric(topology="ring", port="p0", reverse_port="p1")


def relay(src: str, src_port: str, dst: str, dst_port: str, target: int) -> str:
    """A stand-in for the twin's data-plane link: an address that names the link it was asked for."""
    return f"relay({src}.{src_port}->{dst}.{dst_port}):{target}"


def layout(hosts: list[str], *, fabric: JobFabric | None = None, link=None) -> Layout:
    ranks = ranks_of(hosts)
    return Layout.of(ranks, lab_ports(29500, len(ranks)), ADDRESSES.__getitem__, fabric=fabric, link=link)


def test_a_hosts_ranks_are_its_gpus_in_rank_order():
    ranks = ranks_of(["gpu01", "gpu01", "gpu02", "gpu02"])
    assert ranks == [Rank(0, "gpu01", 0), Rank(1, "gpu01", 1), Rank(2, "gpu02", 0), Rank(3, "gpu02", 1)]
    assert ranks_per_host(ranks) == {"gpu01": 2, "gpu02": 2}


def test_on_a_lab_rank_r_listens_on_port_plus_r_and_the_rendezvous_on_port_plus_world():
    assert lab_ports(29500, 4) == [29500, 29501, 29502, 29503, 29504]


def test_the_twins_ports_are_distinct_and_free_below_the_ephemeral_range():
    ports = free_ports(5, random.Random(1))
    assert len(set(ports)) == 5
    assert all(1024 <= p < ephemeral_low() for p in ports)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", ports[0]))  # free: a rank can bind it


def test_every_rank_reaches_every_rank_directly_on_a_lab():
    lay = layout(["gpu01", "gpu02", "gpu03", "gpu04"], fabric=DUPLEX_RING)
    direct = ["10.0.0.1:29500", "10.0.0.2:29501", "10.0.0.3:29502", "10.0.0.4:29503"]
    assert lay.direct == direct
    assert (lay.master, lay.master_address, lay.master_port) == ("gpu01", "10.0.0.1", 29504)
    assert all(lay.peers_of(r) == direct for r in lay.ranks)


def test_the_rendezvous_moves_with_rank_0s_host():
    lay = layout(["gpu09", "gpu02", "gpu03", "gpu04"])
    assert (lay.master, lay.master_address) == ("gpu09", "10.0.0.9")


def test_in_the_twin_a_rank_reaches_its_ring_neighbour_through_the_link_between_their_ports():
    lay = layout(["gpu01", "gpu02", "gpu03", "gpu04"], fabric=DUPLEX_RING, link=relay)
    peers = lay.peers_of(lay.ranks[3])
    assert peers[0] == "relay(gpu04.p0->gpu01.p1):29500"  # the ring wraps: rank 3's neighbour is rank 0
    assert peers[1:] == lay.direct[1:]  # every other rank, and itself, directly


def test_a_one_way_fabric_carries_no_connection_so_peers_stay_direct():
    lay = layout(["gpu01", "gpu02"], fabric=JobFabric(topology="ring", port="p0"), link=relay)
    assert lay.peers_of(lay.ranks[0]) == lay.direct


def test_a_torchrun_host_merges_its_ranks_views_of_their_neighbours():
    """Two ranks per host: rank 1's neighbour (rank 2) and rank 3's (rank 0) are on the other host, reached
    through a relay; rank 0's and rank 2's are on their own host, reached directly.
    """
    lay = layout(["gpu01", "gpu01", "gpu02", "gpu02"], fabric=DUPLEX_RING, link=relay)
    first, second = lay.direct[0], lay.direct[2]
    assert lay.host_peers("gpu01") == [first, lay.direct[1], "relay(gpu01.p0->gpu02.p1):29502", lay.direct[3]]
    assert lay.host_peers("gpu02") == ["relay(gpu02.p0->gpu01.p1):29500", lay.direct[1], second, lay.direct[3]]
