"""The job's ranks: which host runs each one, and which of that host's GPUs it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Rank:
    index: int
    host: str
    local: int  # index among the ranks of its host: its GPU


def ranks_of(hosts: list[str]) -> list[Rank]:
    """The ranks of an assignment: hosts[rank] runs that rank, a host's ranks numbered from 0 in rank order."""
    seen: dict[str, int] = {}
    ranks = []
    for index, host in enumerate(hosts):
        ranks.append(Rank(index, host, seen.get(host, 0)))
        seen[host] = seen.get(host, 0) + 1
    return ranks


def ranks_per_host(ranks: list[Rank]) -> dict[str, int]:
    """How many ranks each host runs (LOCAL_WORLD_SIZE, torchrun's --nproc-per-node), hosts in rank order."""
    counts: dict[str, int] = {}
    for r in ranks:
        counts[r.host] = counts.get(r.host, 0) + 1
    return counts
