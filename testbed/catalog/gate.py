"""The regression gate (`testbed gate`): did a span get slower from a baseline selection of runs to a candidate one,
beyond noise? docs/catalog.md states the rule; the statistic is testbed.results.stats.median_ratio_interval.

A selection is written as KEY=VALUE items (`tag=before`, `commit=3f2a`, `playbook=ocs-reconfig,twin`...): the
filters of `testbed runs`, parsed by `parse_selection`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from testbed.catalog.query import span_columns
from testbed.contracts.errors import UserError
from testbed.results.stats import median_ratio_interval

DEFAULT_MAX_SLOWDOWN_PCT = 5.0
KEYS = ("run", "playbook", "inventory", "target", "status", "since", "until", "commit", "tag", "protocol")
FLAGS = {"lab": ("target", "lab"), "twin": ("target", "twin")}  # a bare word as short for KEY=VALUE
SLOWER, OK, UNSURE = "slower", "ok", "cannot tell"


def parse_selection(items: Iterable[str], option: str = "--baseline") -> dict:
    """The filters of `select_runs` from KEY=VALUE items, each item possibly several joined by commas: `tag`
    repeats (all must hold), every other key once; `lab` and `twin` alone are target=lab, target=twin. UserError
    naming the option and the item for anything else.
    """
    filters: dict = {}
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not eq and key in FLAGS:
                key, value = FLAGS[key]
            elif not eq or not value or key not in KEYS:
                why = f"unknown key {key!r}" if eq and key not in KEYS else "give KEY=VALUE"
                raise UserError(f"{option} {part!r}: {why}; keys: {', '.join(KEYS)} (e.g. {option} tag=before,twin)")
            if key == "tag":
                filters.setdefault("tag", []).append(value)
            elif key in filters:
                raise UserError(f"{option}: {key} given twice ({filters[key]!r} and {value!r}); give it once")
            else:
                filters[key] = value
    if not filters:
        raise UserError(f"{option}: select some runs, e.g. {option} tag=before (keys: {', '.join(KEYS)})")
    return filters


def gate(
    spans: Iterable[str],
    baseline: dict,
    candidate: dict,
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    max_slowdown_pct: float = DEFAULT_MAX_SLOWDOWN_PCT,
    seed: int = 0,
) -> dict:
    """Each span's verdict between the runs `baseline` and `candidate` select (select_runs' filters).

    Per span: both sides' runs, sample counts and pooled medians, the ratio of the medians (candidate / baseline)
    with its 95 % bootstrap interval, and the verdict: `slower` when the interval's lower bound is above
    1 + max_slowdown_pct/100 (slower beyond noise and beyond the tolerance), `ok` when its upper bound is at or
    below it (any slowdown is within the tolerance), `cannot tell` between. `failed` lists the slower spans.
    UserError when a side selects no run, or no run of a side measured a span.
    """
    names = list(dict.fromkeys(spans))
    if max_slowdown_pct < 0:
        raise UserError(f"--max-slowdown {max_slowdown_pct:g}: a percentage of 0 or more")
    sides = {}
    for side, filters in (("baseline", baseline), ("candidate", candidate)):
        runs = span_columns(results_dirs, names, **filters)
        sides[side] = runs
        for span in names:
            if not any(span in r["spans"] for r in runs):
                said = ", ".join(f"{k}={'+'.join(v) if isinstance(v, list) else v}" for k, v in filters.items())
                measured = sorted({s for r in runs for s in r["spans"]})
                raise UserError(
                    f"the {side} ({said}) has no run that measured {span!r}"
                    + (f"; its runs measured: {', '.join(measured)}" if measured else "; `testbed runs` lists the runs")
                )
    overlap = {r["path"] for r in sides["baseline"]} & {r["path"] for r in sides["candidate"]}
    if overlap:
        raise UserError(
            f"the baseline and the candidate share {len(overlap)} run(s) (e.g. {min(overlap)}): select disjoint runs"
        )
    limit = 1 + max_slowdown_pct / 100
    by_span: dict[str, dict] = {}
    failed: list[str] = []
    out = {"max_slowdown_pct": max_slowdown_pct, "limit": limit, "spans": by_span, "failed": failed}
    for span in names:
        groups = {side: [r for r in runs if span in r["spans"]] for side, runs in sides.items()}
        stats = median_ratio_interval(
            [r["spans"][span] for r in groups["baseline"]], [r["spans"][span] for r in groups["candidate"]], seed=seed
        )
        interval = stats["interval"]
        if interval is None:
            verdict = UNSURE
        elif interval[0] > limit:
            verdict = SLOWER
        elif interval[1] <= limit:
            verdict = OK
        else:
            verdict = UNSURE
        by_span[span] = {
            **stats,
            "baseline_runs": [r["run_id"] for r in groups["baseline"]],
            "candidate_runs": [r["run_id"] for r in groups["candidate"]],
            "baseline_n": int(sum(len(r["spans"][span]) for r in groups["baseline"])),
            "candidate_n": int(sum(len(r["spans"][span]) for r in groups["candidate"])),
            "verdict": verdict,
        }
        if verdict == SLOWER:
            failed.append(span)
    return out
