"""A job's fabric (the playbook's `job.fabric`) over an assignment of ranks to hosts: the links it needs, the
host ports it uses, and the ports each ring neighbour pair talks over (the reference workload, a ring
all-reduce, sends from rank r to rank r+1).

- ring: rank r's `port` -> rank r+1; with `reverse_port`, duplex links port <-> next host's reverse_port.
- torus2d: a dims[0] x dims[1] torus, x rings on `port` (and `reverse_port`), y rings on `y_port` (and
  `y_reverse_port`). Ranks sit along a Hamiltonian cycle of the torus (topology.torus_cycle), so every
  ring neighbour pair (r, r+1) is joined by a torus link and the workload's ring runs on the torus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.fabric.circuits import Link
from testbed.fabric.topology import duplex_ring, ring, torus2d_ring, torus_ring_ports

if TYPE_CHECKING:
    from testbed.config.sections import JobFabric


def fabric_links(fabric: JobFabric, hosts: list[str]) -> list[Link]:
    """The directed links of the fabric over `hosts` (hosts[rank] runs that rank)."""
    if fabric.topology == "torus2d":
        rows, cols = _dims(fabric)
        return torus2d_ring(hosts, rows, cols, _ports(fabric), _reverse_ports(fabric))
    if fabric.reverse_port:
        return duplex_ring(hosts, fabric.port, fabric.reverse_port)
    return ring(hosts, fabric.port)


def fabric_ports(fabric: JobFabric) -> list[str]:
    """Every host port the fabric may put a circuit on."""
    ports = [fabric.port, fabric.reverse_port, fabric.y_port, fabric.y_reverse_port]
    return list(dict.fromkeys(p for p in ports if p))


def ring_link_ports(fabric: JobFabric, rank: int) -> tuple[str, str] | None:
    """(rank's port, rank+1's port) of the duplex link that carries rank -> rank+1; None when the fabric is
    one-way (no reverse ports), where no single link carries a connection both ways.
    """
    if fabric.reverse_port is None:
        return None
    if fabric.topology == "torus2d":
        rows, cols = _dims(fabric)
        reverse = _reverse_ports(fabric)
        assert reverse is not None  # reverse_port is set, so y_reverse_port is (the check of a duplex torus)
        return torus_ring_ports(rank, rows, cols, _ports(fabric), reverse)
    return fabric.port, fabric.reverse_port


# A torus2d fabric has its dims and y_port, and y_reverse_port when it has reverse_port: the playbook's checks
# refuse one without (testbed/documents/checks.py), before any of these runs.


def _dims(fabric: JobFabric) -> tuple[int, int]:
    assert fabric.dims is not None
    rows, cols = fabric.dims
    return rows, cols


def _ports(fabric: JobFabric) -> tuple[str, str]:
    assert fabric.y_port is not None
    return fabric.port, fabric.y_port


def _reverse_ports(fabric: JobFabric) -> tuple[str, str] | None:
    if fabric.reverse_port is None:
        return None
    assert fabric.y_reverse_port is not None
    return fabric.reverse_port, fabric.y_reverse_port
