"""Fabric logic, pure: logical topologies over an assignment of ranks to hosts, the circuits each switch
must hold for them, the minimal change from one set of circuits to another, and which spare replaces a
failed host. No I/O here: the planner and the procedures call it."""

from testbed.fabric.circuits import Link, PathError, links_to_circuits, parse_link
from testbed.fabric.diff import circuit_diff
from testbed.fabric.spares import choose_spare
from testbed.fabric.topology import all_to_all_schedule, duplex_ring, ring, torus2d

__all__ = [
    "Link",
    "PathError",
    "links_to_circuits",
    "parse_link",
    "circuit_diff",
    "choose_spare",
    "ring",
    "duplex_ring",
    "torus2d",
    "all_to_all_schedule",
]
