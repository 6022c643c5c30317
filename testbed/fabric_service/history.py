"""The job's fabric service in a run's history (docs/fabric_service.md): what `testbed check` verifies of it, and
what `testbed heal` records for a service that died with its runner.

A service's window runs from its `fabric_service.start` mark to its `fabric_service.stop` (or the end of the
history). Connection numbers start again in each window. The server answers every line it reads exactly once, in
order, and records the request before the answer; an answer carries its request's id. The one answer without a
request is to a line too long to read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

START, STOP = "fabric_service.start", "fabric_service.stop"
REQUEST, ANSWER, UNANSWERED = "fabric_service.request", "fabric_service.answer", "fabric_service.unanswered"


class CircuitReplay(Protocol):
    """A switch driver's audit model (its DriverSpec.audit_model): the circuits its commands leave."""

    def replay(self, circuits: dict[int, int], lines: list[str]) -> dict[int, int]:
        """The circuits (ingress -> egress) after the commands `lines` (audit.jsonl's data) from `circuits`."""


@dataclass
class Window:
    """One service's events in a run's history, from its start mark to its stop."""

    start: dict[str, Any]  # its start mark
    stop: dict[str, Any] | None = None
    requests: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # conn -> its request events, in order
    answers: dict[int, list[Any]] = field(default_factory=dict)  # conn -> the ids its answers carry, in order
    changes: int = 0

    def unanswered(self) -> list[dict[str, Any]]:
        """Each request matched to the first answer left on its connection with its id (a hello's and an
        unreadable line's id is null).
        """
        out = []
        for conn, requests in self.requests.items():
            left = list(self.answers.get(conn, []))
            for r in requests:
                rid = r["data"].get("id")
                if rid in left:
                    left.remove(rid)
                else:
                    out.append(r)
        return out


def windows(events: list[dict[str, Any]]) -> list[Window]:
    """Each service's window in the history's events, in order."""
    out: list[Window] = []
    for e in events:
        op = e["op"]
        if op == START:
            out.append(Window(e))
        elif not out or not op.startswith("fabric_service."):
            continue
        elif op == STOP:
            out[-1].stop = e
        elif op == REQUEST:
            out[-1].requests.setdefault(e["data"]["conn"], []).append(e)
        elif op in (ANSWER, UNANSWERED):  # heal's record of a request the dead service never answered counts
            out[-1].answers.setdefault(e["data"]["conn"], []).append(e["data"].get("id"))
        elif op == "fabric_service.change":
            out[-1].changes += 1
    return out


def requests_answered(events: list[dict[str, Any]]) -> list[str]:
    """Every request a rank made was answered, or recorded by `testbed heal` as never answered."""
    problems = []
    for w in windows(events):
        for r in w.unanswered():
            d = r["data"]
            what = d.get("op") or "an unreadable line"
            config = f" {d['config']}" if d.get("config") else ""
            problems.append(
                f"seq {r['seq']}: rank {d.get('rank')}'s {what}{config} (connection {d['conn']}, id {d.get('id')}) "
                "was never answered, nor recorded as unanswered (`testbed heal` records those of a dead run)"
            )
    return problems


def fabric_within_allowed(
    events: list[dict[str, Any]],
    audit: list[dict[str, Any]],
    initial: dict[str, dict[int, int]],
    model_of: Callable[[str], CircuitReplay | None],
) -> list[str]:
    """While a service ran, every circuit on a port its configurations use belonged to one of them.

    Each switch's commands (audit.jsonl) are replayed through its driver's audit model from the circuits it held
    when the run identified it; the state at the window's start and after every command inside it is checked.
    Audit lines and events are placed on one timeline by their `mono_ns` (one machine's CLOCK_MONOTONIC: the
    runner records both).
    """
    spans = []
    for w in windows(events):
        allowed: dict[str, set[tuple[int, int]]] = {}
        for circuits in w.start["data"]["configurations"].values():
            for sw, pairs in circuits.items():
                allowed.setdefault(sw, set()).update((int(i), int(e)) for i, e in pairs)
        end = w.stop["mono_ns"] if w.stop is not None else math.inf
        spans.append((w.start["mono_ns"], end, w.start["seq"], allowed))
    problems: list[str] = []
    for sw in sorted({sw for *_, allowed in spans for sw in allowed}):
        model = model_of(sw)
        if model is None or sw not in initial:
            continue
        state = dict(initial[sw])
        commands = [(n, a) for n, a in enumerate(audit) if a["device"] == sw and a["direction"] == "tx"]
        for start, end, seq, allowed in spans:
            if sw not in allowed:
                continue
            ports = {p for pair in allowed[sw] for p in pair}
            while commands and commands[0][1]["mono_ns"] < start:  # before the window: replay only
                state = model.replay(state, [commands.pop(0)[1]["data"]])
            problems += _outside(state, allowed[sw], ports, f"{sw} when the service started (seq {seq})")
            while commands and commands[0][1]["mono_ns"] <= end:
                n, a = commands.pop(0)
                state = model.replay(state, [a["data"]])
                where = f"{sw} after audit line {n + 1} ({a['data'].strip()[:60]!r}, at {a['mono_ns']})"
                problems += _outside(state, allowed[sw], ports, where)
    return problems


def _outside(state: dict[int, int], allowed: set[tuple[int, int]], ports: set[int], where: str) -> list[str]:
    bad = sorted(c for c in state.items() if (c[0] in ports or c[1] in ports) and c not in allowed)
    if not bad:
        return []
    return [f"{where}: circuit(s) {bad[:8]} on the service's ports belong to none of its configurations"]
