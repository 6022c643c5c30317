"""How far the measured failover latency is from the twin's ground truth.

An emulated run's folder holds twin_truth.jsonl (emulators/truth.py): on the twin's clock, when the twin
actually delivered each fault and when each rank actually wrote each line. For every failover the run
measured (the `<measure>.total` span, from fault_injected to first_step), the truth is the span from the
fault the twin applied on the failed host to the moment the relaunched rank on the spare wrote the very
step line the framework took as first_step. The error is measured minus truth: positive when the
framework saw the failover as longer than it was.

A failover whose truth cannot be found is listed with the reason, never dropped silently.
"""

from __future__ import annotations

import re
from pathlib import Path

from testbed.events import Op, read_jsonl
from testbed.results.stats import summarize

TRUTH_FILE = "twin_truth.jsonl"
FAULT_EVENTS = ("fault", "signal")  # what the twin logs when it delivers a fault to a host or a process
WINDOW_NS = 1_000_000_000  # a fault the twin applied this far from the measured injection is another one


def failover_accuracy(run_dir: Path, progress: str, clock_offset_ns: int = 0) -> dict | None:
    """Per failover: measured and true latency and their difference; None without a ground-truth file or
    without failovers. clock_offset_ns is the twin's clock minus the runner's (0 on one machine).
    """
    truth_path = run_dir / TRUTH_FILE
    if not truth_path.exists():
        return None
    events = read_jsonl(run_dir / "events.jsonl").records
    truth = read_jsonl(truth_path).records
    pattern = re.compile(progress)
    rows: list[dict] = []
    unmatched: list[dict] = []
    for failover in _failovers(events):
        row = _match(failover, truth, pattern, clock_offset_ns)
        (rows if "truth_ms" in row else unmatched).append(row)
    if not rows and not unmatched:
        return None
    errors = [r["error_ms"] for r in rows]
    return {
        "failovers": len(rows) + len(unmatched),
        "matched": len(rows),
        "unmatched": unmatched,
        "clock_offset_ns": clock_offset_ns,
        "error_ms": summarize(errors),
        "abs_error_ms": summarize([abs(e) for e in errors]),
        "start_error_ms": summarize([r["start_error_ms"] for r in rows]),
        "end_error_ms": summarize([r["end_error_ms"] for r in rows]),
        "trigger": _trigger_priority(rows),
        "per_trial": rows,
    }


def _trigger_priority(rows: list[dict]) -> str:
    """How the twin fired the faults of these failovers (emulators/realtime.py): "real-time", "normal",
    "mixed", or "untimed" (no timed trigger, e.g. a signal over SSH).
    """
    kinds = {r["trigger_realtime"] for r in rows}
    if kinds <= {None}:
        return "untimed"
    if None in kinds or len(kinds) > 1:
        return "mixed"
    return "real-time" if kinds == {True} else "normal"


def _failovers(events: list[dict]) -> list[dict]:
    """One entry per measured failover total: its span, the failed host, the spare and the resumed step."""
    by_step: dict[tuple, dict] = {}
    for e in events:
        key = (e.get("trial"), e.get("step"))
        if e["type"] == "mark" and e["op"] == Op.FAULT_INJECTED:
            by_step.setdefault(key, {})["failed"] = e.get("device")
        elif e["type"] == "mark" and e["op"] == Op.FAILOVER_RESUMED:
            by_step.setdefault(key, {}).update(spare=e.get("device"), step_no=e["data"]["step"])
        elif e["type"] == "measure" and e["op"].endswith(".total") and "start_ns" in e.get("data", {}):
            entry = by_step.setdefault(key, {})
            entry.update(measure=e["op"], start_ns=e["data"]["start_ns"], end_ns=e["data"]["end_ns"])
    return [
        {"trial": key[0], "step": key[1], **v}
        for key, v in by_step.items()
        if "measure" in v and "spare" in v and "failed" in v
    ]


def _match(f: dict, truth: list[dict], pattern: re.Pattern, offset_ns: int) -> dict:
    row = {"trial": f["trial"], "failed": f["failed"], "spare": f["spare"], "step_no": f["step_no"]}
    row["measured_ms"] = round((f["end_ns"] - f["start_ns"]) / 1e6, 4)
    start = f["start_ns"] + offset_ns  # the measured injection, on the twin's clock
    faults = [
        t
        for t in truth
        if t["event"] in FAULT_EVENTS and t.get("host") == f["failed"] and abs(t["t_ns"] - start) < WINDOW_NS
    ]
    if not faults:
        return {**row, "reason": f"the twin logged no fault on {f['failed']} within 1 s of the injection"}
    fault = min(faults, key=lambda t: abs(t["t_ns"] - start))
    for t in truth:
        if t["event"] != "line" or t.get("host") != f["spare"] or t["t_ns"] < fault["t_ns"]:
            continue
        m = pattern.search(t["line"])
        if m and int(m.group(1)) == f["step_no"]:
            true_ms = (t["t_ns"] - fault["t_ns"]) / 1e6
            # The timed trigger behind this fault: the one sent for the measured injection moment.
            sent = (f["failed"], f["start_ns"])
            trigger = next((x for x in truth if x["event"] == "trigger" and (x["host"], x["at_ns"]) == sent), None)
            return {
                **row,
                "truth_ms": round(true_ms, 4),
                "error_ms": round(row["measured_ms"] - true_ms, 4),
                "start_error_ms": round((start - fault["t_ns"]) / 1e6, 4),
                "end_error_ms": round((f["end_ns"] + offset_ns - t["t_ns"]) / 1e6, 4),
                "fault": fault.get("op") or fault.get("signal"),
                # None: the fault was not a timed trigger (a signal sent over SSH), or the twin predates it
                "trigger_realtime": trigger["realtime"] if trigger else None,
            }
    return {**row, "reason": f"the twin logged no line 'step {f['step_no']}' on {f['spare']} after the fault"}
