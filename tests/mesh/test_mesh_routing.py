"""Routing proven by multiplying out the ideal transfer matrix; the chip's wiring agrees with the layout."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drivers.mesh import layout
from emulators.mesh.chip import MeshChip
from emulators.mesh.spec import MeshSpec
from testbed.fabric.topology import all_to_all_schedule


def assert_routes(perm: list[int]) -> None:
    n = len(perm)
    states = layout.route(perm)
    assert set(states) <= {layout.BAR, layout.CROSS}
    power = np.abs(layout.ideal_transfer(states, n)) ** 2
    expected = np.zeros((n, n))
    expected[perm, range(n)] = 1.0
    np.testing.assert_allclose(power, expected, atol=1e-12)
    assert layout.decode(states, n) == perm


def test_every_permutation_of_4():
    for perm in itertools.permutations(range(4)):
        assert_routes(list(perm))


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(8))))
def test_random_permutations_of_8(perm):
    assert_routes(list(perm))


@pytest.mark.parametrize("seed", [0, 1])
def test_permutations_of_32(seed):
    assert_routes([int(x) for x in np.random.default_rng(seed).permutation(32)])


def test_partial_permutation_is_completed():
    perm = layout.complete([2, -1, 0, -1])
    assert sorted(perm) == [0, 1, 2, 3] and perm[0] == 2 and perm[2] == 0


def test_chip_wiring_matches_the_layout():
    """The emulated chip, with ideal heaters, has the transfer matrix the driver's layout predicts."""
    n = 8
    chip = MeshChip(
        MeshSpec(
            name="c",
            size=n,
            phi0_spread_rad=0.0,
            alpha_spread=0.0,
            crosstalk=0.0,
            insertion_loss_db=0.0,
            resistance_spread=0.0,
        )
    )
    perm = [3, 0, 7, 5, 1, 2, 6, 4]
    states = layout.route(perm)
    for h, s in enumerate(states):  # theta = pi*s: P = s * P_pi; current drive: I = sqrt(P/R)
        chip.set_drive(h, "I", math.sqrt(s * chip.spec.p_pi_mw / chip.resistance[h] * 1000), 0.0)
    np.testing.assert_allclose(chip.transfer(1.0), layout.ideal_transfer(states, n), atol=1e-9)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_all_to_all_matchings_route_through_the_mesh(n):
    """PipSwitch's schedule: N-1 matchings connect every ordered pair once, each a permutation the mesh routes."""
    hosts = [str(i) for i in range(n)]
    rounds = [[int(dst[0]) for _, dst in matching] for matching in all_to_all_schedule(hosts)]
    assert len(rounds) == n - 1
    pairs = [(i, p[i]) for p in rounds for i in range(n)]
    assert sorted(pairs) == sorted((i, j) for i in range(n) for j in range(n) if i != j)
    for perm in rounds:
        assert layout.decode(layout.route(perm), n) == perm
