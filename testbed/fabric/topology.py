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


def torus2d(
    hosts: list[str],
    rows: int,
    cols: int,
    ports: tuple[str, str] = ("p0", "p1"),
    reverse_ports: tuple[str, str] | None = None,
) -> list[Link]:
    """rows x cols torus, hosts[r * cols + c] at row r, column c: every row a ring on ports[0] (x), every
    column a ring on ports[1] (y), one way. With `reverse_ports` (x, y) every ring is duplex instead, as
    duplex_ring cables it: each host's ports[0] <-> the next host in its row's reverse_ports[0], and its
    ports[1] <-> the next host in its column's reverse_ports[1] (four ports per host).
    """
    if rows * cols != len(hosts):
        raise ValueError(f"a {rows}x{cols} torus needs {rows * cols} hosts, got {len(hosts)}")
    links: list[Link] = []
    rings = [([hosts[r * cols + c] for c in range(cols)], 0) for r in range(rows)]
    rings += [([hosts[r * cols + c] for r in range(rows)], 1) for c in range(cols)]
    for members, axis in rings:
        if reverse_ports is None:
            links += ring(members, ports[axis])
        else:
            links += duplex_ring(members, ports[axis], reverse_ports[axis])
    return links


def torus_cycle(rows: int, cols: int) -> list[tuple[int, int]]:
    """(row, column) of each rank along a Hamiltonian cycle of the rows x cols torus: rank r and rank
    r+1 (mod rows * cols) are always torus neighbours, so a ring over the ranks runs on torus links.

    A boustrophedon: along row 0 left to right, down, along row 1 right to left, ... ; with an even
    number of rows the last row ends in column 0, right above row 0 across the column's wrap-around link.
    With an odd number of rows and an even number of columns the same goes column by column. A torus with
    one row or one column is a ring. Both odd (and larger than 1): ValueError (such a cycle exists, but
    this order does not give it).
    """
    if rows == 1 or cols == 1:
        return [(i, 0) if cols == 1 else (0, i) for i in range(rows * cols)]
    if rows % 2 == 0:
        return [(r, c if r % 2 == 0 else cols - 1 - c) for r in range(rows) for c in range(cols)]
    if cols % 2 == 0:
        return [(r if c % 2 == 0 else rows - 1 - r, c) for c in range(cols) for r in range(rows)]
    raise ValueError(
        f"a {rows}x{cols} torus: ranks are ordered along the torus by rows (an even number of rows) or by "
        "columns (an even number of columns); use dims with an even number of rows or columns"
    )


def torus2d_ring(
    hosts: list[str],
    rows: int,
    cols: int,
    ports: tuple[str, str] = ("p0", "p1"),
    reverse_ports: tuple[str, str] | None = None,
) -> list[Link]:
    """torus2d with rank r (hosts[r]) placed at torus_cycle(rows, cols)[r], so that the ring over the ranks
    (r -> r+1, as a ring all-reduce sends) runs on torus links.
    """
    if rows * cols != len(hosts):
        raise ValueError(f"a {rows}x{cols} torus needs {rows * cols} hosts, got {len(hosts)}")
    grid = [""] * len(hosts)
    for rank, (r, c) in enumerate(torus_cycle(rows, cols)):
        grid[r * cols + c] = hosts[rank]
    return torus2d(grid, rows, cols, ports, reverse_ports)


def torus_ring_ports(
    rank: int, rows: int, cols: int, ports: tuple[str, str], reverse_ports: tuple[str, str]
) -> tuple[str, str]:
    """(rank's port, next rank's port) of the duplex torus2d_ring link that joins rank and rank+1 (mod W):
    the x or y link between them, taken from whichever end transmits on ports[axis].
    """
    cycle = torus_cycle(rows, cols)
    (r0, c0), (r1, c1) = cycle[rank], cycle[(rank + 1) % len(cycle)]
    axis, here, there, size = (0, c0, c1, cols) if r0 == r1 else (1, r0, r1, rows)
    if (here + 1) % size == there:  # the next rank is the next host along this ring: rank transmits forward
        return ports[axis], reverse_ports[axis]
    return reverse_ports[axis], ports[axis]  # the next rank is the previous host along it


def all_to_all_schedule(hosts: list[str], port: str = "p0") -> list[list[Link]]:
    """N-1 matchings that together connect every ordered pair once: in matching k, rank i transmits to
    rank i+k (mod N). Each matching is a permutation, so it fits a port with one transmitter and one
    receiver per host.
    """
    n = len(hosts)
    return [[((hosts[i], port), (hosts[(i + k) % n], port)) for i in range(n)] for k in range(1, n)]


def duplex_ring(hosts: list[str], right_port: str = "p0", left_port: str = "p1") -> list[Link]:
    """A ring of duplex links, as labs cable one: each host's `right_port` to the next host's `left_port`,
    light both ways (a TCP connection between neighbours needs both directions).
    """
    n = len(hosts)
    if n < 2:
        return []
    links: list[Link] = []
    for i in range(n):
        a, b = (hosts[i], right_port), (hosts[(i + 1) % n], left_port)
        links += [(a, b), (b, a)]
    return links
