"""Fabric logic, pure: logical topologies over an assignment of ranks to hosts, the circuits each switch
must hold for them (through one switch or several, over trunks), the minimal change from one set of
circuits to another, and which spare replaces a failed host. No I/O here: the planner and the procedures
call it."""

from testbed.fabric.circuits import Link, PathError, Route, links_to_circuits, parse_link, route_link
from testbed.fabric.diff import circuit_diff
from testbed.fabric.spares import choose_spare
from testbed.fabric.topology import all_to_all_schedule, duplex_ring, ring, torus2d, torus2d_ring, torus_cycle

__all__ = [
    "Link",
    "PathError",
    "Route",
    "links_to_circuits",
    "route_link",
    "parse_link",
    "circuit_diff",
    "choose_spare",
    "ring",
    "duplex_ring",
    "torus2d",
    "torus2d_ring",
    "torus_cycle",
    "all_to_all_schedule",
]
