"""All-to-all connectivity from perfect matchings (PipSwitch): which circuits to hold, one after another.

`ordered` (default): N-1 cyclic shifts, matching k sends input i to output (i + k) mod N. Every ordered
pair (i -> j, i != j) is connected in exactly one matching; so every unordered pair twice, once per
direction (a host sends on input i and receives on output i: it needs one circuit per direction).
`unordered`: the round-robin 1-factorisation of K_N (N even): N-1 involutions, each pairing the ports
two by two (i <-> j both ways in the same matching); every unordered pair exactly once.
"""

from __future__ import annotations


def ordered_matchings(n: int) -> list[list[int]]:
    return [[(i + k) % n for i in range(n)] for k in range(1, n)]


def unordered_matchings(n: int) -> list[list[int]]:
    if n % 2:
        raise ValueError("a 1-factorisation of K_N needs N even")
    rounds = []
    for r in range(n - 1):
        perm = [0] * n
        pairs = [(n - 1, r)] + [((r + k) % (n - 1), (r - k) % (n - 1)) for k in range(1, n // 2)]
        for a, b in pairs:
            perm[a], perm[b] = b, a
        rounds.append(perm)
    return rounds


def as_circuits(n: int, perm: list[int]) -> list[tuple[int, int]]:
    """0-based permutation -> (input 1..N, output N+1..2N) circuits."""
    return [(i + 1, n + 1 + o) for i, o in enumerate(perm)]
