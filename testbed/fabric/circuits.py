"""Host-to-host links -> circuits per switch, through the inventory's fibre map."""

from __future__ import annotations

from collections.abc import Iterable

from testbed.config.inventory import Inventory
from testbed.config.playbook import LINK_PATTERN

Pair = tuple[int, int]
# A directed link: (source host, source port) -> (destination host, destination port).
Link = tuple[tuple[str, str], tuple[str, str]]


class PathError(ValueError):
    """The fibre map gives no path for a link, or two links need the same port."""


def parse_link(text: str) -> list[Link]:
    """'a:p0 -> b:p0' is one directed link; 'a:p0 <-> b:p0' is two."""
    m = LINK_PATTERN.match(text)
    if not m:
        raise PathError(f"link {text!r} is not of the form 'host:port -> host:port' (or '<->')")
    a, b = (m.group(1), m.group(2)), (m.group(4), m.group(5))
    return [(a, b)] if m.group(3) == "->" else [(a, b), (b, a)]


def links_to_circuits(links: Iterable[Link], inv: Inventory) -> dict[str, tuple[Pair, ...]]:
    """The circuit each link needs: the source's transmit fibre (a switch ingress) to the destination's
    receive fibre (an egress of the same switch)."""
    out: dict[str, set[Pair]] = {}
    for src, dst in links:
        f_src, f_dst = inv.fibre_of(*src), inv.fibre_of(*dst)
        for end, fibre in ((src, f_src), (dst, f_dst)):
            if fibre is None:
                raise PathError(f"{end[0]}:{end[1]} has no fibre in the inventory's fibre map")
        if f_src.switch != f_dst.switch:
            raise PathError(
                f"{src[0]}:{src[1]} -> {dst[0]}:{dst[1]} needs a path from {f_src.switch} to "
                f"{f_dst.switch}; paths through several switches are not supported yet"
            )
        out.setdefault(f_src.switch, set()).add((f_src.ingress, f_dst.egress))
    for sw, pairs in out.items():
        for index, what in ((0, "ingress"), (1, "egress")):
            ports = [p[index] for p in pairs]
            dup = sorted({p for p in ports if ports.count(p) > 1})
            if dup:
                raise PathError(f"{what} port(s) {dup} of {sw} would carry two circuits; a port carries one")
    return {sw: tuple(sorted(pairs)) for sw, pairs in out.items()}
