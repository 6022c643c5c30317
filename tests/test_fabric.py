"""Fabric logic: the diff really reaches the target and touches nothing else, topologies are well formed,
the all-to-all schedule covers every pair, spare choice follows the policy and repeats for a seed."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.config import load_inventory
from testbed.fabric import all_to_all_schedule, choose_spare, circuit_diff, links_to_circuits, ring, torus2d
from testbed.fabric.circuits import PathError
from testbed.fabric.spares import NoSpareError

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
