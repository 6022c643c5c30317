"""Logical topologies as directed links between (host, port) ends, over ranks placed on hosts.

`hosts` is the assignment: hosts[rank] is the host that runs that rank; a failover changes the list, and
the same function then gives the links of the new assignment.
"""

from __future__ import annotations

from testbed.fabric.circuits import Link


def ring(hosts: list[str], port: str = "p0", reverse_port: str | None = None) -> list[Link]:
    """rank i transmits to rank i+1 on `port`; with `reverse_port`, also to rank i-1 on that port."""
    n = len(hosts)
    if n < 2:
        return []
    links = [((hosts[i], port), (hosts[(i + 1) % n], port)) for i in range(n)]
    if reverse_port:
        links += [((hosts[i], reverse_port), (hosts[(i - 1) % n], reverse_port)) for i in range(n)]
    return links


def torus2d(hosts: list[str], rows: int, cols: int, ports: tuple[str, str] = ("p0", "p1")) -> list[Link]:
    """rows x cols torus (row-major ranks): every row a ring on ports[0], every column a ring on ports[1]."""
    if rows * cols != len(hosts):
        raise ValueError(f"a {rows}x{cols} torus needs {rows * cols} hosts, got {len(hosts)}")
    links: list[Link] = []
    for r in range(rows):
        links += ring([hosts[r * cols + c] for c in range(cols)], ports[0])
    for c in range(cols):
        links += ring([hosts[r * cols + c] for r in range(rows)], ports[1])
    return links


def all_to_all_schedule(hosts: list[str], port: str = "p0") -> list[list[Link]]:
    """N-1 matchings that together connect every ordered pair once: in matching k, rank i transmits to
    rank i+k (mod N). Each matching is a permutation, so it fits a port with one transmitter and one
    receiver per host."""
    n = len(hosts)
    return [[((hosts[i], port), (hosts[(i + k) % n], port)) for i in range(n)] for k in range(1, n)]


def duplex_ring(hosts: list[str], right_port: str = "p0", left_port: str = "p1") -> list[Link]:
    """A ring of duplex links, as labs cable one: each host's `right_port` to the next host's `left_port`,
    light both ways (a TCP connection between neighbours needs both directions)."""
    n = len(hosts)
    if n < 2:
        return []
    links: list[Link] = []
    for i in range(n):
        a, b = (hosts[i], right_port), (hosts[(i + 1) % n], left_port)
        links += [(a, b), (b, a)]
    return links
