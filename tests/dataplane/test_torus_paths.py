"""A job's torus fabric, planned and then held by a real OCS engine, gives the workload's ring lit light paths
under the twin's rules: every rank r reaches rank r+1 over a duplex torus link, before and after a failover
swaps a host for a spare (the switch goes through the minimal change).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from emulators.dataplane import LightPaths
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec
from testbed.config.sections import JobFabric
from testbed.documents.inventory import Inventory
from testbed.fabric.circuits import links_to_circuits
from testbed.fabric.jobfabric import fabric_links, ring_link_ports
from testbed.fabric.topology import torus2d
from testbed.families.switching import circuit_diff
from testbed.twin.bridge import twin_spec

PORTS = ["p0", "p1", "p2", "p3"]
SIZE = 48
HOSTS = [f"gpu{i:02d}" for i in range(1, 11)]
TORUS = JobFabric(topology="torus2d", dims=[2, 4], port="p0", reverse_port="p1", y_port="p2", y_reverse_port="p3")


def inventory() -> Inventory:
    devices: dict = {
        "ocs1": {
            "kind": "ocs",
            "driver": "polatis-scpi",
            "transport": {"type": "serial", "port": "/dev/x"},
            "size": SIZE,
        }
    }
    fibres = []
    for host in HOSTS:
        devices[host] = {
            "kind": "gpu_host",
            "driver": "ssh",
            "transport": {"type": "ssh", "host": host, "user": "lab"},
            "ports": PORTS,
        }
        for port in PORTS:
            k = len(fibres) + 1
            fibres.append({"host": host, "port": port, "switch": "ocs1", "ingress": k, "egress": SIZE + k})
    return Inventory.model_validate({"name": "torus", "devices": devices, "fibres": fibres})


class Switch:
    def __init__(self, inv: Inventory):
        self.engine = PolatisEngine(OcsSpec("ocs1", size=SIZE, jitter_ms=0.0), clock=lambda: 0.0)
        devices = {"ocs1": SimpleNamespace(kind="ocs", engine=self.engine)}
        self.paths = LightPaths(twin_spec(inv, seed=0).fibres, devices)
        self.now = 0.0

    def apply(self, circuits: tuple[tuple[int, int], ...], managed: set[int]) -> None:
        remove, add = circuit_diff(dict(self.engine.conn), circuits, managed)
        for pairs, verb in ((remove, "SUB"), (add, "ADD")):
            if pairs:
                ingress = ",".join(str(i) for i, _ in pairs)
                egress = ",".join(str(e) for _, e in pairs)
                channels = f"(@{ingress})" if verb == "SUB" else f"(@{ingress}),(@{egress})"
                self.engine.new_session().handle(f":OXC:SWIT:CONN:{verb} {channels}", self.now)
        self.now += 1.0  # well past the switching time

    def ring_paths(self, hosts: list[str]) -> list[dict]:
        out = []
        for rank, host in enumerate(hosts):
            mine, theirs = ring_link_ports(TORUS, rank)
            out.append(self.paths.path(host, mine, hosts[(rank + 1) % len(hosts)], theirs, self.now))
        return out


def test_the_ring_runs_on_lit_torus_links_before_and_after_a_failover():
    inv = inventory()
    managed = {p for f in inv.fibres for p in (f.ingress, f.egress)}
    switch = Switch(inv)
    hosts = HOSTS[:8]
    switch.apply(links_to_circuits(fabric_links(TORUS, hosts), inv)["ocs1"], managed)
    assert all(p["lit"] for p in switch.ring_paths(hosts)), switch.ring_paths(hosts)
    # gpu03 fails; the spare gpu09 takes its rank and the torus is rewired with the minimal change.
    moved = [h if h != "gpu03" else "gpu09" for h in hosts]
    before = dict(switch.engine.conn)
    switch.apply(links_to_circuits(fabric_links(TORUS, moved), inv)["ocs1"], managed)
    paths = switch.ring_paths(moved)
    assert all(p["lit"] for p in paths), paths
    kept = set(before.items()) & set(switch.engine.conn.items())
    assert len(kept) == 32 - 8  # only the failed host's four ports' circuits, both ways, were redone
    # The old host's ring neighbours no longer reach it.
    assert not switch.paths.path("gpu02", "p0", "gpu03", "p1", switch.now)["lit"]


def test_ranks_in_row_major_order_would_break_the_ring():
    # Without the boustrophedon the ring's step from the end of row 0 to the start of row 1 (rank 3 -> 4)
    # is no torus link: the relay for it would stay dark and the job would make no progress.
    inv = inventory()
    switch = Switch(inv)
    hosts = HOSTS[:8]
    row_major = torus2d(hosts, 2, 4, ("p0", "p2"), ("p1", "p3"))
    switch.apply(links_to_circuits(row_major, inv)["ocs1"], set())
    dark = [rank for rank, p in enumerate(switch.ring_paths(hosts)) if not p["lit"]]
    assert dark  # some ring neighbour pair has no lit link between them


@pytest.mark.parametrize("dims", [(2, 2), (2, 3), (4, 2), (3, 4), (2, 5)])
def test_every_ring_pair_is_a_duplex_torus_link(dims):
    rows, cols = dims
    hosts = [f"h{i}" for i in range(rows * cols)]
    fabric = TORUS.model_copy(update={"dims": list(dims)})
    links = set(fabric_links(fabric, hosts))
    for rank, host in enumerate(hosts):
        mine, theirs = ring_link_ports(fabric, rank)
        nxt = hosts[(rank + 1) % len(hosts)]
        assert ((host, mine), (nxt, theirs)) in links and ((nxt, theirs), (host, mine)) in links
