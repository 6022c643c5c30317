"""Where a launch's ranks listen: each rank's port, then rank 0's rendezvous port (MASTER_PORT)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from testbed.contracts.errors import StepFailed

# How far below the kernel's ephemeral range free ports are looked for.
FREE_PORT_SPAN = 12000


def lab_ports(base: int, world: int) -> list[int]:
    """On a lab: rank r listens on the playbook's port + r on its host, and the rendezvous is port + world size."""
    return [base + rank for rank in range(world)] + [base + world]


def free_ports(count: int, rng: random.Random) -> list[int]:
    """`count` ports free on 127.0.0.1 now, in random order. In the twin every rank runs on this machine, so each
    launch takes free ports: a rank left over from an earlier run (its twin killed) cannot make this launch fail
    to bind. They are taken below the kernel's ephemeral range: a port from bind(0) is free only until the probe
    closes, and the twin's relays, which bind(0) too, could take it first (a rank's neighbour would then be a
    relay back to itself).
    """
    low = ephemeral_low()
    candidates = list(range(max(1024, low - FREE_PORT_SPAN), low))
    rng.shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise StepFailed(f"no {count} free ports below {low} on 127.0.0.1 for the emulated ranks")


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (bind(0) hands out ports from there up)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
