"""Failover milestones: from a trial's `mark` events to the segments of its failover latency.

A failover trial marks, in order: fault_injected, failure_detected, spare_selected, fabric_reconfigured,
link_verified, job_relaunched, job_ready, first_step. The segments between consecutive milestones are

    detect       fault_injected      -> failure_detected
    select       failure_detected    -> spare_selected
    reconfigure  spare_selected      -> fabric_reconfigured
    verify       fabric_reconfigured -> link_verified
    relaunch     link_verified       -> job_relaunched
    ready        job_relaunched      -> job_ready
    first_step   job_ready           -> first_step

and `total` is fault_injected -> first_step. A job that recovers in-job (`job.recovery: in-job`) is never
relaunched: its trial marks generation_published (the next generation named, the spare in the failed slot) where
a restart marks job_relaunched (IN_JOB_MILESTONES), and that segment is `publish` (link_verified ->
generation_published) where a restart's is `relaunch`; a trial follows the chain whose milestone it marked.
The runner emits them as `measure` events named `<measure>.<segment>` (`failover.detect`, ..., `failover.total`,
see `measure_name`); the report prints them in this order (testbed.results.report.milestone_tables).

Rules:
- Only marks at or after the previous milestone that was found count, so the `job_ready` and `first_step`
  marks of the job's first launch (before the fault) are never taken for the relaunch's.
- Several marks of one milestone (one per rank): the first counts (the first rank to detect the failure),
  except for `job_ready`, where the last rank's mark before the next milestone counts: the job is ready
  when every rank is (as the runner measures it).
- A missing milestone is skipped: the segment then runs from the previous milestone that was found to the
  next one, and its name joins the segments it covers (`select+reconfigure`), so the segments of a trial
  always add up to its total and a merged segment is never mistaken for a single one.
- `total` needs both fault_injected and first_step.
- Times are `mono_ns`; marks taken on different machines do not share a monotonic clock, so segments that
  cross machines carry their clock offset (on the twin every mark is taken on one machine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from testbed.events import Op

MILESTONES: tuple[str, ...] = (
    Op.FAULT_INJECTED,
    Op.FAILURE_DETECTED,
    Op.SPARE_SELECTED,
    Op.FABRIC_RECONFIGURED,
    Op.LINK_VERIFIED,
    Op.JOB_RELAUNCHED,
    Op.JOB_READY,
    Op.FIRST_STEP,
)
# SEGMENTS[i] ends at MILESTONES[i + 1]
SEGMENTS: tuple[str, ...] = ("detect", "select", "reconfigure", "verify", "relaunch", "ready", "first_step")
# recovery: in-job: the same places, the job's relaunch replaced by the next generation's publication
IN_JOB_MILESTONES: tuple[str, ...] = tuple(Op.GENERATION_PUBLISHED if m == Op.JOB_RELAUNCHED else m for m in MILESTONES)
IN_JOB_SEGMENTS: tuple[str, ...] = tuple("publish" if s == "relaunch" else s for s in SEGMENTS)
SEGMENT_NAMES = frozenset(SEGMENTS) | frozenset(IN_JOB_SEGMENTS)
# One colour per segment in every figure (the report's PNG timeline, the HTML page's timeline): a reader who learnt
# that detection is blue on one finds it blue on the next. In-job's publish takes relaunch's colour: the same place.
SEGMENT_COLOURS: dict[str, str] = {
    "detect": "#4e79a7",
    "select": "#f28e2b",
    "reconfigure": "#e15759",
    "verify": "#76b7b2",
    "relaunch": "#59a14f",
    "publish": "#59a14f",
    "ready": "#edc948",
    "first_step": "#b07aa1",
}
OTHER_COLOUR = "#9c9c9c"


def segment_colour(segment: str) -> str:
    """A segment's colour; a joined one (`verify+relaunch`, a milestone skipped) takes its first part's."""
    return SEGMENT_COLOURS.get(segment.split("+")[0], OTHER_COLOUR)


LAST_OF_SEVERAL = frozenset({Op.JOB_READY})  # one mark per rank; the milestone is reached by the last rank
MEASURE_PREFIX = "failover"


def _get(event: Any, key: str) -> Any:
    if isinstance(event, Mapping):
        return event.get(key)
    return getattr(event, key, None)


def trial_milestones(events: Iterable[Any]) -> dict[int, dict[str, int]]:
    """Per trial, the mono_ns of each failover milestone found (rules in the module docstring).

    `events` are dicts as in events.jsonl or `testbed.events.Event` objects; events of other types or
    names, and marks outside a trial, are ignored. Trials come out in ascending order.
    """
    marks: dict[int, dict[str, list[int]]] = {}
    wanted = set(MILESTONES) | set(IN_JOB_MILESTONES)
    for event in events:
        if _get(event, "type") != "mark" or _get(event, "op") not in wanted:
            continue
        trial, ns = _get(event, "trial"), _get(event, "mono_ns")
        if trial is None or ns is None:
            continue
        marks.setdefault(int(trial), {}).setdefault(_get(event, "op"), []).append(int(ns))
    out: dict[int, dict[str, int]] = {}
    for trial in sorted(marks):
        found: dict[str, int] = {}
        floor: int | None = None
        chain, _ = _chain(marks[trial])
        for i, name in enumerate(chain):
            candidates = sorted(t for t in marks[trial].get(name, []) if floor is None or t >= floor)
            if not candidates:
                continue
            at = candidates[0]
            if name in LAST_OF_SEVERAL:
                later = [t for m in chain[i + 1 :] for t in marks[trial].get(m, []) if t >= at]
                before_next = [t for t in candidates if not later or t <= min(later)]
                at = before_next[-1] if before_next else at
            found[name] = floor = at
        out[trial] = found
    return out


def _chain(found: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The milestones and segments a trial follows: in-job's if it published a generation, else restart's."""
    if Op.GENERATION_PUBLISHED in found:
        return IN_JOB_MILESTONES, IN_JOB_SEGMENTS
    return MILESTONES, SEGMENTS


def segments_of(found: Mapping[str, int]) -> list[dict]:
    """Segments of one trial's milestones (name -> mono_ns): dicts with `segment`, `from`, `to`,
    `start_ns`, `end_ns` and `ms`, consecutive, then `total` when fault_injected and first_step are both
    present.
    """
    chain, segments = _chain(found)
    out: list[dict] = []
    prev: int | None = None  # index into the chain of the previous milestone found
    for i, name in enumerate(chain):
        if name not in found:
            continue
        if prev is not None:
            start, end = found[chain[prev]], found[name]
            out.append(
                {
                    "segment": "+".join(segments[prev:i]),
                    "from": chain[prev],
                    "to": name,
                    "start_ns": start,
                    "end_ns": end,
                    "ms": (end - start) / 1e6,
                }
            )
        prev = i
    if MILESTONES[0] in found and MILESTONES[-1] in found:
        start, end = found[MILESTONES[0]], found[MILESTONES[-1]]
        out.append(
            {
                "segment": "total",
                "from": MILESTONES[0],
                "to": MILESTONES[-1],
                "start_ns": start,
                "end_ns": end,
                "ms": (end - start) / 1e6,
            }
        )
    return out


def milestone_spans(events: Iterable[Any]) -> list[dict]:
    """Per trial, the failover segments between consecutive milestone marks plus the total.

    Returns dicts `{"trial", "segment", "from", "to", "start_ns", "end_ns", "ms"}`, trial by trial in
    milestone order, the trial's `total` last. A trial with fewer than two milestones gives nothing.
    """
    out: list[dict] = []
    for trial, found in trial_milestones(events).items():
        out.extend({"trial": trial, **seg} for seg in segments_of(found))
    return out


def measure_name(segment: str, measure: str = MEASURE_PREFIX) -> str:
    """The span name the runner records for a segment: `failover.detect`, ..., `failover.total`."""
    return f"{measure}.{segment}"


def milestone_segments(span_names: Iterable[str], prefix: str) -> list[str]:
    """The segments of measure `prefix` among the span names, in milestone order: the segments, merged segments
    after their first part, other spans of the measure, then the total.
    """
    head = prefix + "."

    def index(part: str) -> int:
        return SEGMENTS.index(part) if part in SEGMENTS else IN_JOB_SEGMENTS.index(part)

    def order(segment: str) -> tuple[int, int, str]:
        if segment == "total":
            return (len(SEGMENTS) + 1, 0, segment)
        parts = segment.split("+")
        if all(p in SEGMENT_NAMES for p in parts):
            return (index(parts[0]), len(parts), segment)
        return (len(SEGMENTS), 0, segment)  # another span of this measure: after the segments

    return sorted((n[len(head) :] for n in span_names if n.startswith(head)), key=order)


def milestone_prefixes(span_names: Iterable[str]) -> list[str]:
    """Measure names (`failover`, or a playbook's own `measure:`) that have milestone segments among the
    span names, in order of first appearance.
    """
    out: list[str] = []
    for name in span_names:
        prefix, _, segment = name.rpartition(".")
        if prefix and prefix not in out and all(part in SEGMENT_NAMES for part in segment.split("+")):
            out.append(prefix)
    return out
