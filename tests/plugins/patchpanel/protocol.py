"""A robotic fibre patch panel's line protocol (made up for the test, in the manner of such panels): one
command per line, one reply line each.

    *IDN?            -> vendor,model,serial,firmware
    SIZE?            -> N (ingress 1..N, egress N+1..2N)
    CONN?            -> "1>17,2>18" (empty when nothing is patched)
    CONN i,e         -> OK | ERR <why>     patch ingress i to egress e (a robot arm moves: BUSY? until done)
    DISC i           -> OK | ERR <why>     unpatch ingress i
    BUSY?            -> 1 while the arm moves, else 0
    POW? e           -> dBm of light on egress e (-60 when dark)
"""

from __future__ import annotations

import re

CONN = re.compile(r"^CONN (\d+),(\d+)$")
DISC = re.compile(r"^DISC (\d+)$")


def parse_circuits(text: str) -> dict[int, int]:
    out = {}
    for item in filter(None, text.split(",")):
        i, _, e = item.partition(">")
        out[int(i)] = int(e)
    return out
