"""A collective sweep's view of a run (collective.allreduce, playbooks/collective-reconfig.yaml, docs/collective.md):
per message size, each case's all-reduce time (p50) and, for each recursive-doubling case, the crossover against
the ring: the largest size at which it was faster (reconfiguring pays up to there), or none. A second table splits
each case's reconfigurations into the switches' own time and the rest, the framework's.

Read from events.jsonl: the all-reduces' measures, which carry the case, its algorithm and fabric, and the message
size, whatever the sweep's parameters are called; and the fabric service's records of each change it made for the
step's job (between its `fabric_service.start`, which names the step, and its `fabric_service.stop`).
Shown by `testbed report` (and at the end of `testbed run`); testbed/results/plots.py draws the same numbers,
log-log, in `collective_time.png`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from testbed.events import read_jsonl
from testbed.results.stats import summarize


@dataclass
class Case:
    algorithm: str
    fabric: str
    times: dict[int, list[float]] = field(default_factory=dict)  # size -> each measured all-reduce's ms
    waits: dict[int, list[float]] = field(default_factory=dict)  # size -> the part spent waiting for the fabric
    # per change the service made for its job, by the time its request was read: the service's timestamps (ns)
    changes: dict[int, dict[str, int]] = field(default_factory=dict)

    def p50(self, size: int) -> float | None:
        return summarize(self.times[size])["p50_ms"] if self.times.get(size) else None


def collective_data(run_dir: Path, summary: dict | None = None) -> tuple[list[int], dict[str, Case]] | None:
    """(sizes, case -> its measures) when the run measured all-reduces; None otherwise."""
    if summary is not None and not any(name.endswith(".time") for name in summary.get("spans") or {}):
        return None  # no all-reduce measured: the events need not be read
    events = read_jsonl(Path(run_dir) / "events.jsonl", missing_ok=True).records
    cases: dict[str, Case] = {}
    of_step: dict[str | None, Case] = {}  # step label -> the case its all-reduces ran
    for e in events:
        data = e.get("data")
        if e.get("type") == "measure" and isinstance(data, dict) and "algorithm" in data and "size_bytes" in data:
            case = cases.setdefault(str(data.get("case")), Case(str(data["algorithm"]), str(data.get("fabric"))))
            case.times.setdefault(int(data["size_bytes"]), []).append(float(data["ms"]))
            case.waits.setdefault(int(data["size_bytes"]), []).append(float(data.get("reconfig_ms", 0.0)))
            of_step[e.get("step")] = case
    serving: Case | None = None  # the case whose job the fabric service is serving
    for e in events:
        raw = e.get("data")
        fields: dict = raw if isinstance(raw, dict) else {}
        if e["op"] == "fabric_service.start":
            serving = of_step.get(e.get("step"))
        elif e["op"] == "fabric_service.stop":
            serving = None
        elif serving is None:
            continue
        elif e["op"] == "fabric_service.change" and "error" not in fields and fields.get("t_received_ns"):
            serving.changes[fields["t_received_ns"]] = {k: v for k, v in fields.items() if k.startswith("t_") and v}
        elif e["op"] == "fabric_service.change_time" and fields.get("start_ns") in serving.changes:
            serving.changes[fields["start_ns"]]["t_answered_ns"] = fields["end_ns"]  # the last rank answered
    if not any(c.times for c in cases.values()):
        return None
    # the rings first (the others are read against them), then in the order the run measured them
    ordered = dict(sorted(cases.items(), key=lambda kv: kv[1].algorithm != "ring"))
    return sorted({s for c in cases.values() for s in c.times}), ordered


def baseline(cases: dict[str, Case], name: str) -> str | None:
    """The ring a case is compared with: the one on the same fabric, else the first ring measured."""
    rings = [n for n, c in cases.items() if c.algorithm == "ring"]
    same = [n for n in rings if cases[n].fabric == cases[name].fabric]
    candidates = same or rings
    return candidates[0] if candidates else None


def crossover(ring: Case, case: Case) -> int | None:
    """The largest message size at which `case` beat the ring (None: at no size)."""
    faster = []
    for size in case.times:
        ms, ring_ms = case.p50(size), ring.p50(size)  # None: no measure of that size
        if ms is not None and ring_ms is not None and ms < ring_ms:
            faster.append(size)
    return max(faster) if faster else None


def size_text(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def collective_tables(run_dir: Path, summary: dict | None = None) -> list[Table]:
    data = collective_data(run_dir, summary)
    if data is None:
        return []
    sizes, cases = data
    waiting = [n for n, c in cases.items() if c.algorithm != "ring"]
    table = Table(title="all-reduce p50 ms per message size (ring vs reconfigured per stage)", title_justify="left")
    table.add_column("message")
    for name, c in cases.items():
        table.add_column(f"{name}\n{c.algorithm} on {c.fabric}", justify="right")
    for name in waiting:
        table.add_column(f"{name}\nof which waiting", justify="right")
    for size in sizes:
        row = [size_text(size)]
        for name, c in cases.items():
            ms, ring = c.p50(size), baseline(cases, name)
            ring_ms = cases[ring].p50(size) if ring is not None and ring != name else None
            mark = " *" if ms is not None and ring_ms is not None and ms < ring_ms else ""
            row.append("" if ms is None else f"{ms:.1f}{mark}")
        for name in waiting:
            waits = cases[name].waits.get(size)
            row.append(f"{summarize(waits)['p50_ms']:.1f}" if waits else "")
        table.add_row(*row)
    n = "/".join(map(str, sorted({len(v) for c in cases.values() for v in c.times.values()})))
    table.caption = f"n = {n} all-reduces per cell, each the slowest rank's time; * faster than the ring"
    table.caption_justify = "left"
    tables = [table]
    if waiting:
        cross = Table(
            title="crossover: the largest size at which reconfiguring per stage beat the ring", title_justify="left"
        )
        for col in ("case", "fabric", "against", "crossover"):
            cross.add_column(col)
        for name in waiting:
            ring = baseline(cases, name)
            at = crossover(cases[ring], cases[name]) if ring is not None else None
            shown = "no ring measured" if ring is None else "none" if at is None else size_text(at)
            cross.add_row(name, cases[name].fabric, ring or "-", shown)
        tables.append(cross)
    changed = {n: c for n, c in cases.items() if c.changes}
    if changed:
        tables.append(_split_table(changed))
    return tables


# Each change, from the request that completed it (read) to the last rank answered, in the service's timestamps.
SEGMENTS = (
    ("request -> command", "t_received_ns", "t_sent_ns"),
    ("command -> light (switches)", "t_sent_ns", "t_verified_ns"),
    ("light -> ready", "t_verified_ns", "t_ready_ns"),
    ("ready -> last answer", "t_ready_ns", "t_answered_ns"),
    ("whole change", "t_received_ns", "t_answered_ns"),
)


def _split_table(cases: dict[str, Case]) -> Table:
    table = Table(title="each reconfiguration, segment by segment (p50 ms)", title_justify="left")
    table.add_column("case")
    table.add_column("changes", justify="right")
    for name, _, _ in SEGMENTS:
        table.add_column(name, justify="right")
    table.add_column("not the switches", justify="right")
    for name, c in cases.items():
        row = [f"{name} ({c.fabric})", str(len(c.changes))]
        for _, start, end in SEGMENTS:
            spans = [(t[end] - t[start]) / 1e6 for t in c.changes.values() if start in t and end in t]
            row.append(f"{summarize(spans)['p50_ms']:.2f}" if spans else "")
        whole = [t for t in c.changes.values() if "t_answered_ns" in t and "t_verified_ns" in t and "t_sent_ns" in t]
        rest = [(t["t_answered_ns"] - t["t_received_ns"] - t["t_verified_ns"] + t["t_sent_ns"]) / 1e6 for t in whole]
        row.append(f"{summarize(rest)['p50_ms']:.2f}" if rest else "")
        table.add_row(*row)
    table.caption = (
        "request: the last rank's, which completed the change; light: every switch showed light on its new circuits; "
        "ready: the result back in the service (and any emulated delay over). Not the switches: the whole change "
        "less command -> light, per change: the framework's share"
    )
    table.caption_justify = "left"
    return table
