"""Fabric logic: the diff really reaches the target and touches nothing else, topologies are well formed,
the all-to-all schedule covers every pair, spare choice follows the policy and repeats for a seed.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.documents import load_inventory
from testbed.documents.checks import check_inventory
from testbed.documents.inventory import Inventory
from testbed.fabric.circuits import PathError, links_to_circuits, parse_link, route_link
from testbed.fabric.spares import NoSpareError, choose_spare
from testbed.fabric.topology import all_to_all_schedule, ring, torus2d, torus_cycle
from testbed.families.switching import circuit_diff

N = 16  # ports per side of the switch in the property tests: ingress 1..16, egress 17..32


def _one_to_one(pairs: list[tuple[int, int]]) -> dict[int, int]:
    by_ingress = dict(pairs)
    egress = Counter(by_ingress.values())
    return {i: e for i, e in by_ingress.items() if egress[e] == 1}


# A random partial matching ingress -> egress, as a switch holds it.
matchings = st.lists(st.tuples(st.integers(1, N), st.integers(N + 1, 2 * N)), max_size=N).map(_one_to_one)


@given(current=matchings, target=matchings, extra=st.sets(st.integers(1, 2 * N)))
def test_diff_reaches_the_target_and_spares_foreign_circuits(current, target, extra):
    managed = {p for pair in target.items() for p in pair} | extra
    remove, add = circuit_diff(current, target.items(), managed)
    after = {i: e for i, e in current.items() if (i, e) not in remove}
    for ingress, egress in add:
        assert ingress not in after, "an add must not land on an ingress still in use"
        assert egress not in after.values(), "an add must not land on an egress still in use"
        after[ingress] = egress
    assert all(after.get(i) == e for i, e in target.items())
    # Nothing outside the managed ports is touched unless it blocks the target.
    for i, e in remove:
        assert i in managed or e in managed
    # Minimal: circuits already in place are kept, and nothing is added twice.
    assert not set(remove) & set(target.items())
    assert not set(add) & set(current.items())


def test_ring_and_torus_give_one_transmitter_and_receiver_per_port():
    hosts = [f"h{i}" for i in range(8)]
    for links in (ring(hosts, "p0", "p1"), torus2d(hosts, 2, 4)):
        sources = Counter(src for src, _ in links)
        sinks = Counter(dst for _, dst in links)
        assert set(sources.values()) == {1} and set(sinks.values()) == {1}
        assert all(src[0] != dst[0] for src, dst in links)
    assert ring(hosts)[-1] == (("h7", "p0"), ("h0", "p0"))
    with pytest.raises(ValueError, match="2x3 torus needs 6 hosts"):
        torus2d(hosts, 2, 3)


@given(st.integers(2, 40))
def test_all_to_all_schedule_connects_every_ordered_pair_exactly_once(n):
    hosts = [f"h{i}" for i in range(n)]
    schedule = all_to_all_schedule(hosts)
    assert len(schedule) == n - 1
    pairs = Counter((src[0], dst[0]) for matching in schedule for src, dst in matching)
    assert set(pairs.values()) == {1}
    assert len(pairs) == n * (n - 1)
    for matching in schedule:  # each matching is a permutation: one transmitter, one receiver per host
        assert len({src for src, _ in matching}) == len({dst for _, dst in matching}) == n


@pytest.fixture(scope="module")
def inventory(repo):
    return load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model


def test_topology_links_become_circuits_through_the_fibre_map(inventory):
    hosts = [f"gpu{i:02d}" for i in range(1, 9)]
    circuits = links_to_circuits(ring(hosts, "p0"), inventory)
    assert list(circuits) == ["ocs1"]
    assert len(circuits["ocs1"]) == 8
    assert (1, 35) in circuits["ocs1"]  # gpu01:p0 transmit (ingress 1) -> gpu02:p0 receive (egress 35)
    with pytest.raises(PathError, match="gpu77:p0 has no fibre"):
        links_to_circuits([(("gpu01", "p0"), ("gpu77", "p0"))], inventory)


def test_spare_choice_prefers_the_same_rack_then_the_least_used(inventory):
    racks = {"gpu09": "rack2", "gpu10": "rack1"}
    devices = dict(inventory.devices)
    for name, rack in racks.items():
        devices[name] = devices[name].model_copy(update={"rack": rack})
    inv = inventory.model_copy(update={"devices": devices})
    assert choose_spare("gpu03", inv, in_use=set(), used_count={}, seed=0) == "gpu10"  # gpu03 is in rack1
    assert choose_spare("gpu03", inv, in_use={"gpu10"}, used_count={}, seed=0) == "gpu09"
    with pytest.raises(NoSpareError):
        choose_spare("gpu03", inv, in_use={"gpu09", "gpu10"}, used_count={}, seed=0)


def test_spare_choice_among_equals_is_fixed_by_the_seed(inventory):
    # Both spares in rack1 and unused: the seed decides, and decides the same way every time.
    picks = {seed: choose_spare("gpu03", inventory, in_use=set(), used_count={}, seed=seed) for seed in range(20)}
    assert set(picks.values()) == {"gpu09", "gpu10"}
    assert picks == {
        seed: choose_spare("gpu03", inventory, in_use=set(), used_count={}, seed=seed) for seed in range(20)
    }
    assert choose_spare("gpu03", inventory, in_use=set(), used_count={"gpu09": 2}, seed=1) == "gpu10"


# --- light paths through several switches (trunks) ----------------------------------------------------

SIZE = 8  # ports per side of every switch in these inventories: ingress 1..8, egress 9..16


def lab(hosts: dict[str, str], trunks: list[dict], **switch_options) -> Inventory:
    """An inventory of OCSes (named by `hosts`' values and the trunks' ends), hosts with one port p0 each
    cabled to its switch on the lowest free ingress / egress, and `trunks`; checked as the loader does.
    """
    switches = sorted({*hosts.values(), *(t["from"] for t in trunks), *(t["to"] for t in trunks)})
    devices: dict = {
        sw: {
            "kind": "ocs",
            "driver": "polatis-scpi",
            "transport": {"type": "serial", "port": f"/dev/tty{sw}"},
            "size": SIZE,
            **switch_options.get(sw, {}),
        }
        for sw in switches
    }
    fibres, used = [], Counter()
    for host, sw in hosts.items():
        devices[host] = {"kind": "gpu_host", "driver": "ssh", "transport": {"type": "ssh", "host": host, "user": "lab"}}
        used[sw] += 1
        fibres.append({"host": host, "port": "p0", "switch": sw, "ingress": used[sw], "egress": SIZE + used[sw]})
    inv = Inventory.model_validate({"name": "lab", "devices": devices, "fibres": fibres, "trunks": trunks})
    assert check_inventory(inv) == []
    return inv


def trunk(src: str, egress: int, dst: str, ingress: int, loss_db: float = 0.5) -> dict:
    return {"from": src, "egress": egress, "to": dst, "ingress": ingress, "loss_db": loss_db}


DUPLEX_1_2 = [trunk("ocs1", 16, "ocs2", 8), trunk("ocs2", 16, "ocs1", 8)]


def test_a_link_across_two_switches_holds_one_circuit_on_each():
    inv = lab({"a": "ocs1", "b": "ocs2"}, DUPLEX_1_2)
    # a transmits into ocs1 ingress 1 -> trunk ocs1:16 -> ocs2:8 -> ocs2 egress 9 (b's receiver); and back.
    assert links_to_circuits(parse_link("a:p0 <-> b:p0"), inv) == {"ocs1": ((1, 16), (8, 9)), "ocs2": ((1, 16), (8, 9))}
    route = route_link((("a", "p0"), ("b", "p0")), inv)
    assert route.switches == ("ocs1", "ocs2") and route.trunks == (0,)
    assert route.loss_db == pytest.approx(1.0 + 0.5 + 1.0)  # two switch passes (insertion_loss_db 1.0), one trunk
    assert route.budget_db == pytest.approx(20.0)  # launch 0 dBm, receiver down to -20 dBm


def test_a_trunk_carries_one_circuit():
    hosts = {"a": "ocs1", "c": "ocs1", "b": "ocs2", "d": "ocs2"}
    one = lab(hosts, [trunk("ocs1", 16, "ocs2", 8)])
    links = [(("a", "p0"), ("b", "p0")), (("c", "p0"), ("d", "p0"))]
    with pytest.raises(
        PathError,
        match=r"c:p0 -> d:p0 needs a path from ocs1 to ocs2 and there is none over free "
        r"trunks; already used: trunks\[0\] \(ocs1:16 -> ocs2:8\) by a:p0 -> b:p0",
    ):
        links_to_circuits(links, one)
    two = lab(hosts, [trunk("ocs1", 16, "ocs2", 8), trunk("ocs1", 15, "ocs2", 7)])
    assert links_to_circuits(links, two) == {"ocs1": ((1, 16), (2, 15)), "ocs2": ((7, 10), (8, 9))}
    assert links_to_circuits(links + links, two) == links_to_circuits(links, two)  # a repeated link is one


def test_a_path_over_the_loss_budget_is_refused_with_the_numbers():
    inv = lab({"a": "ocs1", "b": "ocs2"}, [trunk("ocs1", 16, "ocs2", 8, loss_db=19.0)])
    with pytest.raises(PathError) as err:
        links_to_circuits(parse_link("a:p0 -> b:p0"), inv)
    assert str(err.value) == (
        "a:p0 -> b:p0: the path through ocs1 -> ocs2 loses 21.00 dB (ocs1 1.00 + ocs2 1.00 + trunks[0] 19.00), "
        "over the loss budget of 20.00 dB (a:p0 launches 0 dBm, b:p0 receives down to -20 dBm); add a trunk "
        "with less loss, or correct launch_power_dbm / rx_sensitivity_dbm in the fibre map"
    )
    # A stronger transmitter makes the same path fit.
    fibres = [f.model_copy(update={"launch_power_dbm": 1.5}) if f.host == "a" else f for f in inv.fibres]
    assert links_to_circuits(parse_link("a:p0 -> b:p0"), inv.model_copy(update={"fibres": fibres}))


def test_the_route_has_the_fewest_switches_then_the_lowest_loss():
    hosts = {"a": "ocs1", "b": "ocs3"}
    via_ocs2 = [trunk("ocs1", 16, "ocs2", 8, 0.0), trunk("ocs2", 16, "ocs3", 8, 0.0)]
    direct = [trunk("ocs1", 15, "ocs3", 7, 3.0), trunk("ocs1", 14, "ocs3", 6, 1.0)]
    inv = lab(hosts, via_ocs2 + direct)
    route = route_link((("a", "p0"), ("b", "p0")), inv)
    assert route.switches == ("ocs1", "ocs3") and route.trunks == (3,)  # direct beats the lossless detour
    assert route.circuits == (("ocs1", (1, 14)), ("ocs3", (6, 9)))
    detour = lab(hosts, via_ocs2)
    assert route_link((("a", "p0"), ("b", "p0")), detour).circuits == (
        ("ocs1", (1, 16)),
        ("ocs2", (8, 16)),
        ("ocs3", (8, 9)),
    )


def test_no_path_says_why():
    with pytest.raises(PathError, match="the inventory has no trunks"):
        links_to_circuits(parse_link("a:p0 -> b:p0"), lab({"a": "ocs1", "b": "ocs2"}, []))
    # Only a trunk the wrong way round.
    with pytest.raises(PathError, match="needs a path from ocs1 to ocs2 and there is none over free trunks$"):
        links_to_circuits(parse_link("a:p0 -> b:p0"), lab({"a": "ocs1", "b": "ocs2"}, [DUPLEX_1_2[1]]))
    # A trunk on a port the run may not touch is not used.
    barred = lab({"a": "ocs1", "b": "ocs2"}, DUPLEX_1_2, ocs1={"allowed_ports": "1-15"})
    with pytest.raises(PathError, match=r"may not touch \(allowed_ports\): trunks\[0\] \(ocs1:16 -> ocs2:8\)"):
        links_to_circuits(parse_link("a:p0 -> b:p0"), barred)


@st.composite
def trunk_graphs(draw):
    """A few switches, hosts spread over them, and random one-way trunks on free ports."""
    n_switches = draw(st.integers(2, 4))
    switches = [f"ocs{i + 1}" for i in range(n_switches)]
    hosts = {f"h{i}": draw(st.sampled_from(switches)) for i in range(draw(st.integers(2, 5)))}
    pairs = draw(st.lists(st.tuples(st.sampled_from(switches), st.sampled_from(switches)), max_size=10))
    free_egress = {sw: list(range(2 * SIZE, SIZE + 5, -1)) for sw in switches}  # hosts take the low ports
    free_ingress = {sw: list(range(SIZE, 5, -1)) for sw in switches}
    trunks = []
    for src, dst in pairs:
        if src != dst and free_egress[src] and free_ingress[dst]:
            loss = draw(st.floats(0, 4, allow_nan=False))
            trunks.append(trunk(src, free_egress[src].pop(0), dst, free_ingress[dst].pop(0), loss))
    links = draw(st.lists(st.tuples(st.sampled_from(sorted(hosts)), st.sampled_from(sorted(hosts))), max_size=6))
    return lab(hosts, trunks), [((a, "p0"), (b, "p0")) for a, b in links if a != b]


def _switch_hops(inv: Inventory, start: str, goal: str) -> int | None:
    """Fewest switches from start to goal over the trunks (breadth first), for comparison."""
    seen, frontier, n = {start}, {start}, 1
    while frontier:
        if goal in frontier:
            return n
        frontier = {t.to for t in inv.trunks if t.from_ in frontier and t.to not in seen}
        seen |= frontier
        n += 1
    return None


@given(trunk_graphs())
def test_routes_use_each_port_once_on_real_switches_and_are_shortest(graph):
    inv, links = graph
    switches = inv.switches()
    for link in links:
        src, dst = inv.fibre_of(*link[0]), inv.fibre_of(*link[1])
        shortest = _switch_hops(inv, src.switch, dst.switch)
        try:
            route = route_link(link, inv)
        except PathError:
            assert shortest is None  # the budget cannot be exceeded here: at most 4 switches, 4 dB trunks
            continue
        assert len(route.switches) == shortest
        assert all(sw in switches for sw, _ in route.circuits)
        ports = [(sw, p) for sw, pair in route.circuits for p in pair]
        assert len(ports) == len(set(ports)), route
        # The circuits chain: the source's ingress, then trunk by trunk, to the destination's egress.
        assert route.circuits[0] == (src.switch, (src.ingress, route.circuits[0][1][1]))
        assert route.circuits[-1][0] == dst.switch and route.circuits[-1][1][1] == dst.egress
        for k, (here, there) in zip(route.trunks, zip(route.circuits, route.circuits[1:], strict=False), strict=True):
            t = inv.trunks[k]
            assert (t.from_, t.egress) == (here[0], here[1][1]) and (t.to, t.ingress) == (there[0], there[1][0])
    # Several links at once: every switch port carries at most one circuit, every trunk one link.
    try:
        circuits = links_to_circuits(links, inv)
    except PathError:
        return
    for sw, pairs in circuits.items():
        assert sw in switches
        ports = [p for pair in pairs for p in pair]
        assert len(ports) == len(set(ports))


# --- the job's torus: ranks along a Hamiltonian cycle -------------------------------------------------


@given(st.integers(1, 8), st.integers(1, 8))
def test_torus_cycle_visits_every_place_once_and_steps_to_a_neighbour(rows, cols):
    if rows > 1 and cols > 1 and rows % 2 and cols % 2:
        with pytest.raises(ValueError, match="an even number of rows or columns"):
            torus_cycle(rows, cols)
        return
    cycle = torus_cycle(rows, cols)
    assert sorted(cycle) == [(r, c) for r in range(rows) for c in range(cols)]
    for (r0, c0), (r1, c1) in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        dr, dc = (r1 - r0) % rows, (c1 - c0) % cols
        # one step along a row or a column, wrapping around (a 1-wide torus: the same place is no step)
        assert (dr == 0 and dc in (1, cols - 1)) or (dc == 0 and dr in (1, rows - 1)), cycle


def test_a_duplex_torus_gives_every_port_one_partner_both_ways():
    hosts = [f"h{i}" for i in range(8)]
    links = torus2d(hosts, 2, 4, ("x", "y"), ("x_back", "y_back"))
    assert len(links) == 8 * 4  # every host transmits on each of its four ports
    sources = Counter(src for src, _ in links)
    sinks = Counter(dst for _, dst in links)
    assert set(sources.values()) == {1} and set(sinks.values()) == {1}
    assert all((dst, src) in set(links) for src, dst in links)  # duplex
