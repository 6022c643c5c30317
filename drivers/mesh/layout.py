"""The tree (Spanke) MZI layout, pinned MZI convention, permutation routing and the ideal transfer matrix.

Layout: N = 2^k ports. Input i (0-based) feeds a 1xN splitter tree of N-1 cells, output o a Nx1 combiner
tree; splitter leaf o of tree i is cabled to combiner leaf i of tree o. So every (input, output) pair has
exactly one path of 2k cells, every permutation is routed with bar/cross states only (the network is
strictly, hence also rearrangeably, non-blocking), and light of one input never meets itself: with
output-only photodiodes every heater can be calibrated from output powers (calibration.py). The cost is
2N(N-1) cells (112 for N=8, 1984 for N=32) against N log N for a Benes network.

Trees are heap-indexed (node k = 1..N-1, children 2k and 2k+1, leaf N+j = port j). Splitter node: BAR
sends the light to child 2k, CROSS to 2k+1. Combiner node: upper input from child 2k, lower from 2k+1,
upper output onwards; BAR passes the upper input, CROSS the lower. Heater (channel, 0-based) of
splitter tree i node k is i*(N-1)+k-1, of combiner tree o node k is N(N-1)+o*(N-1)+k-1.

MZI convention: upper-arm heater between two 50:50 couplers [[1, i], [i, 1]]/sqrt2:
T(theta) = 1/2 [[e^{i theta} - 1, i(e^{i theta} + 1)], [i(e^{i theta} + 1), 1 - e^{i theta}]].
theta = pi: BAR (|T00| = 1); theta = 0: CROSS (|T10| = 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BAR, CROSS = 1, 0  # cell states; the target phase of a state is pi * state
LAYOUT_NAME = "spanke-tree"


def check_size(n: int) -> int:
    if n < 2 or n & (n - 1):
        raise ValueError(f"the tree layout needs a power-of-two port count >= 2, got {n}")
    return n


def heater_count(n: int) -> int:
    return 2 * n * (n - 1)


def size_from_heaters(heaters: int) -> int:
    """N from the channel count 2N(N-1)."""
    n = int(round((1 + math.sqrt(1 + 2 * heaters)) / 2))
    if heater_count(n) != heaters:
        raise ValueError(f"{heaters} heater channels is not 2N(N-1) for any N")
    return check_size(n)


def splitter_heater(n: int, i: int, node: int) -> int:
    return i * (n - 1) + node - 1


def combiner_heater(n: int, o: int, node: int) -> int:
    return n * (n - 1) + o * (n - 1) + node - 1


def path_nodes(n: int, leaf: int) -> list[tuple[int, int]]:
    """(node, child) pairs from the root down to leaf `leaf` (0-based port): the child taken at each node."""
    child, out = n + leaf, []
    while child > 1:
        out.append((child // 2, child))
        child //= 2
    return out[::-1]


def route(perm: Sequence[int], *, default: int = BAR) -> list[int]:
    """Cell states (BAR/CROSS per heater) that send input i to output perm[i] (0-based).

    `perm` may be partial: perm[i] = -1 (or None) leaves input i unrouted. Cells on no path get `default`.
    """
    n = check_size(len(perm))
    targets = [p for p in perm if p is not None and p >= 0]
    if len(set(targets)) != len(targets) or any(not 0 <= p < n for p in targets):
        raise ValueError(f"not a (partial) permutation of 0..{n - 1}: {list(perm)}")
    states = [default] * heater_count(n)
    for i, o in enumerate(perm):
        if o is None or o < 0:
            continue
        for node, child in path_nodes(n, o):  # splitter tree i towards leaf o
            states[splitter_heater(n, i, node)] = BAR if child == 2 * node else CROSS
        for node, child in path_nodes(n, i):  # combiner tree o from leaf i
            states[combiner_heater(n, o, node)] = BAR if child == 2 * node else CROSS
    return states


def decode(states: Sequence[int], n: int) -> list[int]:
    """The permutation the states route (follow each input's splitter tree, check the combiner passes it).

    -1 where the combiner tree does not pass the input through (not a consistent circuit).
    """
    out = []
    for i in range(n):
        node = 1
        while node < n:
            node = 2 * node + (0 if states[splitter_heater(n, i, node)] == BAR else 1)
        o = node - n
        ok = all(
            states[combiner_heater(n, o, nd)] == (BAR if child == 2 * nd else CROSS) for nd, child in path_nodes(n, i)
        )
        out.append(o if ok else -1)
    return out


def mzi(theta: float) -> np.ndarray:
    e = np.exp(1j * theta)
    return 0.5 * np.array([[e - 1, 1j * (e + 1)], [1j * (e + 1), 1 - e]])


def ideal_transfer(states: Sequence[int], n: int) -> np.ndarray:
    """Field transfer T[o, i] of the lossless chip, multiplied out cell by cell from 2x2 MZI matrices.

    Every tree is simulated as waveguides: a splitter node's unused input and a combiner node's dumped
    output are explicit, so the check does not assume the unique-path property it is meant to prove.
    """
    n = check_size(n)
    theta = [math.pi * s for s in states]
    cells = [mzi(t) for t in theta]
    # Splitter trees: field on each node's input waveguide, top down.
    leaf_field = np.zeros((n, n), dtype=complex)  # [i, o]
    for i in range(n):
        field = {1: 1.0 + 0j}
        for node in range(1, n):
            out = cells[splitter_heater(n, i, node)] @ np.array([field[node], 0.0])  # lower input unused
            field[2 * node], field[2 * node + 1] = out[0], out[1]
        for o in range(n):
            leaf_field[i, o] = field[n + o]
    transfer = np.zeros((n, n), dtype=complex)
    for o in range(n):
        for i in range(n):
            # Combiner tree o with only leaf i lit (linear: columns are independent), bottom up.
            field = {n + j: (leaf_field[i, o] if j == i else 0j) for j in range(n)}
            for node in range(n - 1, 0, -1):
                out = cells[combiner_heater(n, o, node)] @ np.array([field[2 * node], field[2 * node + 1]])
                field[node] = out[0]  # out[1] is dumped
            transfer[o, i] = field[1]
    return transfer


def circuits_to_perm(n: int, circuits: dict[int, int]) -> list[int]:
    """{input 1..N: output N+1..2N} -> 0-based partial permutation (-1 = any)."""
    perm = [-1] * n
    for i, e in circuits.items():
        if not 1 <= i <= n or not n < e <= 2 * n:
            raise ValueError(f"circuit {i}->{e}: inputs are 1..{n}, outputs {n + 1}..{2 * n}")
        perm[i - 1] = e - n - 1
    return perm


def complete(perm: Sequence[int]) -> list[int]:
    """Fill the -1 entries of a partial permutation with the unused outputs (lowest first)."""
    used = {p for p in perm if p >= 0}
    free = iter(o for o in range(len(perm)) if o not in used)
    return [p if p >= 0 else next(free) for p in perm]
