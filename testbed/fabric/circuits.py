"""Host-to-host links -> circuits per switch, through the inventory's fibre map and its trunks.

A link whose two host ports are cabled to one switch needs one circuit there: the source's transmit fibre
(a switch ingress) to the destination's receive fibre (an egress of the same switch).

A link between host ports on different switches is routed over trunks (switch-to-switch fibres, one
direction each) and needs one circuit per switch on the way. The route is the one with the fewest switches,
then the lowest loss, then the lowest trunk indices, so the same links always give the same circuits. It
uses only trunks that no earlier link of the same call uses (a trunk fibre carries one circuit) and whose
ports a run may touch, on switches that are not read-only.

Every route must fit the loss budget: the sender's launch power minus the route's loss (each switch's pass
loss, each trunk's loss_db) must stay at or above the receiver's sensitivity (Fibre.rx_sensitivity_dbm).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from testbed.config.cabling import Fibre, Trunk
from testbed.config.common import LINK_PATTERN
from testbed.fabric.inventory_view import InventoryView

Pair = tuple[int, int]
# A directed link: (source host, source port) -> (destination host, destination port).
Link = tuple[tuple[str, str], tuple[str, str]]


class PathError(ValueError):
    """The fibre map gives no path for a link, or two links need the same port."""


@dataclass(frozen=True)
class Route:
    """The light path of one link: the switches it crosses in order, the trunks between them (indices into
    Inventory.trunks), the circuit each switch must hold, and the loss along it.
    """

    switches: tuple[str, ...]
    trunks: tuple[int, ...]
    circuits: tuple[tuple[str, Pair], ...]
    loss_db: float
    budget_db: float


def parse_link(text: str) -> list[Link]:
    """'a:p0 -> b:p0' is one directed link; 'a:p0 <-> b:p0' is two."""
    m = LINK_PATTERN.match(text)
    if not m:
        raise PathError(f"link {text!r} is not of the form 'host:port -> host:port' (or '<->')")
    a, b = (m.group(1), m.group(2)), (m.group(4), m.group(5))
    return [(a, b)] if m.group(3) == "->" else [(a, b), (b, a)]


def link_label(link: Link) -> str:
    (a, p), (b, q) = link
    return f"{a}:{p} -> {b}:{q}"


def links_to_circuits(links: Iterable[Link], inv: InventoryView) -> dict[str, tuple[Pair, ...]]:
    """The circuits every switch must hold for `links` (routed in the order given; a link given twice is
    routed once).
    """
    out: dict[str, set[Pair]] = {}
    busy: dict[int, str] = {}  # trunk index -> the link that already uses it
    for link in dict.fromkeys(links):
        route = route_link(link, inv, busy)
        for sw, pair in route.circuits:
            out.setdefault(sw, set()).add(pair)
        for k in route.trunks:
            busy[k] = link_label(link)
    for sw, pairs in out.items():
        for index, what in ((0, "ingress"), (1, "egress")):
            ports = [p[index] for p in pairs]
            dup = sorted({p for p in ports if ports.count(p) > 1})
            if dup:
                raise PathError(f"{what} port(s) {dup} of {sw} would carry two circuits; a port carries one")
    return {sw: tuple(sorted(pairs)) for sw, pairs in out.items()}


def _fibre(inv: InventoryView, end: tuple[str, str]) -> Fibre:
    fibre = inv.fibre_of(*end)
    if fibre is None:
        raise PathError(f"{end[0]}:{end[1]} has no fibre in the inventory's fibre map")
    return fibre


def route_link(link: Link, inv: InventoryView, busy: Mapping[int, str] | None = None) -> Route:
    """The route of one link, avoiding the trunks in `busy` (index -> the link using it); PathError when
    there is none or it does not fit the loss budget.
    """
    src, dst = link
    label = link_label(link)
    f_src, f_dst = _fibre(inv, src), _fibre(inv, dst)
    hops = _fewest_switches(f_src.switch, f_dst.switch, inv, busy or {})
    if hops is None:
        raise PathError(_no_path(label, f_src.switch, f_dst.switch, inv, busy or {}))
    switches = [f_src.switch]
    circuits: list[tuple[str, Pair]] = []
    ingress = f_src.ingress
    for k in hops:
        t = inv.trunks[k]
        circuits.append((t.from_, (ingress, t.egress)))
        switches.append(t.to)
        ingress = t.ingress
    circuits.append((f_dst.switch, (ingress, f_dst.egress)))
    terms = [(sw, _pass_loss(inv, sw)) for sw in switches] + [(f"trunks[{k}]", inv.trunks[k].loss_db) for k in hops]
    loss = sum(db for _, db in terms)
    budget = _budget(f_src, f_dst)
    if loss > budget + 1e-9:
        detail = " + ".join(f"{what} {db:.2f}" for what, db in terms)
        raise PathError(
            f"{label}: the path through {' -> '.join(switches)} loses {loss:.2f} dB ({detail}), over the loss "
            f"budget of {budget:.2f} dB ({src[0]}:{src[1]} launches {f_src.launch_power_dbm:g} dBm, "
            f"{dst[0]}:{dst[1]} receives down to {f_dst.rx_sensitivity_dbm:g} dBm); add a trunk with less loss, "
            "or correct launch_power_dbm / rx_sensitivity_dbm in the fibre map"
        )
    return Route(tuple(switches), tuple(hops), tuple(circuits), loss, budget)


def _budget(f_src: Fibre, f_dst: Fibre) -> float:
    return f_src.launch_power_dbm - f_dst.rx_sensitivity_dbm


def _pass_loss(inv: InventoryView, switch: str) -> float:
    dev = inv.switches().get(switch)
    return dev.pass_loss_db() if dev is not None else 0.0


def _usable(t: Trunk, inv: InventoryView) -> bool:
    """A run may set circuits on both ends of the trunk."""
    switches = inv.switches()
    for name, port in ((t.from_, t.egress), (t.to, t.ingress)):
        dev = switches.get(name)
        if dev is None or dev.read_only or not dev.port_allowed(port):
            return False
    return True


def _fewest_switches(start: str, goal: str, inv: InventoryView, busy: Mapping[int, str]) -> list[int] | None:
    """Trunk indices from `start` to `goal`: fewest switches, then lowest loss, then lowest indices
    (Dijkstra over switches with that lexicographic cost); [] when start is goal; None when unreachable.
    """
    if start == goal:
        return []
    out_of: dict[str, list[tuple[int, Trunk]]] = {}
    for k, t in enumerate(inv.trunks):
        if k not in busy and _usable(t, inv):
            out_of.setdefault(t.from_, []).append((k, t))
    heap: list[tuple[int, float, tuple[int, ...], str]] = [(1, _pass_loss(inv, start), (), start)]
    done: set[str] = set()
    while heap:
        n, loss, path, sw = heapq.heappop(heap)
        if sw in done:
            continue
        if sw == goal:
            return list(path)
        done.add(sw)
        for k, t in out_of.get(sw, []):
            if t.to not in done:
                heapq.heappush(heap, (n + 1, loss + t.loss_db + _pass_loss(inv, t.to), (*path, k), t.to))
    return None


def _no_path(label: str, start: str, goal: str, inv: InventoryView, busy: Mapping[int, str]) -> str:
    text = f"{label} needs a path from {start} to {goal}"
    if not inv.trunks:
        return text + ", and the inventory has no trunks (switch-to-switch fibres, `trunks:`) to make one"
    text += " and there is none over free trunks"
    taken = [f"trunks[{k}] ({inv.trunks[k].label}) by {by}" for k, by in sorted(busy.items())]
    barred = [f"trunks[{k}] ({t.label})" for k, t in enumerate(inv.trunks) if k not in busy and not _usable(t, inv)]
    if taken:
        text += "; already used: " + ", ".join(taken)
    if barred:
        text += "; on a read-only switch or on ports a run may not touch (allowed_ports): " + ", ".join(barred)
    return text
