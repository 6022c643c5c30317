"""The regression gate (`testbed gate`): did a span get slower from a baseline selection of runs to a candidate one,
beyond noise, at any sweep point? docs/catalog.md states the rule; the statistic is
testbed.results.stats.median_ratio_interval, one per span and sweep point, the family held by Holm-Bonferroni.

A selection is written as KEY=VALUE items (`tag=before`, `commit=3f2a`, `playbook=ocs-reconfig,twin`...): the
filters of `testbed runs`, parsed by `parse_selection`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from testbed.catalog.changes import find_steps
from testbed.catalog.owners import mine, owner_name, resolve_owners
from testbed.catalog.points import check_selection, group_label, groups, key_value_parts, sort_groups
from testbed.catalog.query import did_you_mean, span_columns, span_counts
from testbed.catalog.selection_keys import DEFAULT_MAX_SLOWDOWN_PCT, KEYS
from testbed.contracts.errors import UserError
from testbed.results.stats import median_ratio_interval

FLAGS = {"lab": ("target", "lab"), "twin": ("target", "twin")}  # a bare word as short for KEY=VALUE
SLOWER, OK, UNSURE = "slower", "ok", "cannot tell"
# The family-wise error rate of a gate, one-sided: with one comparison, the rule of a 95 % interval's low end above
# the limit. Holm-Bonferroni keeps it over every (span, sweep point) compared.
ALPHA = 0.025
CORRECTION = "Holm-Bonferroni"
DEFAULT_RESAMPLES = 2000


def parse_selection(items: Iterable[str], option: str = "--baseline") -> dict:
    """The filters of `select_runs` from KEY=VALUE items, each item possibly several joined by commas: `tag`
    repeats (all must hold), every other key once; `lab` and `twin` alone are target=lab, target=twin. UserError
    naming the option and the item for anything else.
    """
    filters: dict = {}
    for part, key, eq, value in key_value_parts(items):
        if not eq and key in FLAGS:
            key, value = FLAGS[key]
        elif not eq or not value or key not in KEYS:
            why = f"unknown key {key!r}{did_you_mean(key, KEYS)}" if eq and key not in KEYS else "give KEY=VALUE"
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


def owned(filters: dict) -> dict:
    """The selection's run folders limited to their owners: `owner=` as given (names resolved to uids), else the
    invoking user's alone, so a folder another account drops into a shared results folder cannot change the verdict
    (testbed.catalog.owners).
    """
    return filters | {"owner": resolve_owners([filters["owner"]]) if "owner" in filters else mine()}


def gate(
    spans: Iterable[str],
    baseline: dict,
    candidate: dict,
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    max_slowdown_pct: float = DEFAULT_MAX_SLOWDOWN_PCT,
    seed: int = 0,
    sweep: dict[str, set[str]] | None = None,
    against_trend: bool = False,
) -> dict:
    """Each span's verdict between the runs `baseline` and `candidate` select (select_runs' filters), sweep point by
    sweep point.

    A comparison is one span at one group, a playbook at one sweep point (testbed.catalog.points; `sweep` selects
    points as --sweep does), with the samples of that group only on both sides: the ratio of the pooled medians
    (candidate / baseline), its 95 % bootstrap interval, and the one-sided bootstrap p-value of "no slower than the
    limit" (limit = 1 + max_slowdown_pct/100). The comparisons are a family: a comparison is `slower` when its
    Holm-Bonferroni adjusted p-value is at most ALPHA (so the chance that any of them fails on noise alone is at
    most ALPHA, however many points the sweep has); `ok` when the interval's upper bound is at or below the limit;
    `cannot tell` otherwise. `failed` lists the spans with a slower point, `failed_points` each slower comparison.
    A group measured on one side only is listed in `unmatched`, never compared. UserError when a side selects no
    run, a span has no group on both sides, or --sweep names no sweep variable of the runs.

    `against_trend`: the baseline is a history, the candidate's runs left out of it; at each group it is cut to its
    runs since the last step of its level (testbed.catalog.changes), so the candidate is compared with where the
    span stands now, not with a level it has since left. Each comparison then says `baseline_since` {run, steps}.
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
                measured = sorted(span_counts(results_dirs, **filters))
                said = _said(filters) or "every run of yours"
                raise UserError(
                    f"the {side} ({said}) has no run that measured {span!r}{did_you_mean(span, measured)}"
                    + (f"; its runs measured: {', '.join(measured)}" if measured else "; `testbed runs` lists the runs")
                )
    overlap = {r["path"] for r in sides["baseline"]} & {r["path"] for r in sides["candidate"]}
    if against_trend:  # the history is every baseline run but the candidate's
        sides["baseline"] = [r for r in sides["baseline"] if r["path"] not in overlap]
        if not sides["baseline"]:
            said = _said(baseline) or "every run of yours"
            raise UserError(f"the baseline ({said}) has no run besides the candidate's: no history to compare with")
    elif overlap:
        raise UserError(
            f"the baseline and the candidate share {len(overlap)} run(s) (e.g. {min(overlap)}): select disjoint runs"
        )
    wanted = sweep or {}
    check_selection(wanted, [k for runs in sides.values() for r in runs for k in (r.get("sweeps") or {}).values()])
    limit = 1 + max_slowdown_pct / 100
    playbooks = sorted({r["playbook"] or "?" for runs in sides.values() for r in runs})
    pairs: list[tuple[str, tuple, dict]] = []
    stepped: dict[tuple, int] = {}  # against_trend: (span, group) -> the steps found in the baseline's history
    unmatched: list[dict] = []
    for span in names:
        by_side = {side: groups(runs, span, wanted) for side, runs in sides.items()}
        if against_trend:
            for g, members in by_side["baseline"].items():
                by_side["baseline"][g], stepped[(span, g)] = _since_last_step(members, max_slowdown_pct, seed)
        common = [g for g in sort_groups(by_side["baseline"]) if g in by_side["candidate"]]
        for side, other in (("baseline", "candidate"), ("candidate", "baseline")):
            for g in sort_groups(by_side[side]):
                if g not in by_side[other]:
                    unmatched.append({"span": span, "side": side, "playbook": g[0], "point": json.loads(g[1])})
        if not common:
            raise UserError(
                f"{span}: the baseline and the candidate have no playbook and sweep point in common "
                f"(baseline: {_groups_said(by_side['baseline'])}; candidate: {_groups_said(by_side['candidate'])})"
            )
        pairs.extend((span, g, by_side) for g in common)
    # Enough resamples that the smallest Holm threshold, ALPHA / comparisons, is many resamples wide.
    resamples = max(DEFAULT_RESAMPLES, math.ceil(2 * len(pairs) / ALPHA))
    comparisons: list[dict] = []
    for span, g, by_side in pairs:
        base, cand = by_side["baseline"][g], by_side["candidate"][g]
        stats = median_ratio_interval(
            [v for _, v in base], [v for _, v in cand], seed=seed, resamples=resamples, limit=limit
        )
        comparisons.append(
            {
                "span": span,
                "playbook": g[0],
                "point": json.loads(g[1]),
                "label": group_label(g[0], g[1], len(playbooks) > 1),
                **stats,
                "baseline_runs": [r["run_id"] for r, _ in base],
                "candidate_runs": [r["run_id"] for r, _ in cand],
                "baseline_n": int(sum(len(v) for _, v in base)),
                "candidate_n": int(sum(len(v) for _, v in cand)),
            }
        )
        if against_trend:
            comparisons[-1]["baseline_since"] = {"run": base[0][0]["run_id"], "steps": stepped[(span, g)]}
    for c, adjusted in zip(comparisons, holm([c["p_above_limit"] for c in comparisons]), strict=True):
        c["p_holm"] = adjusted
        if adjusted <= ALPHA:
            c["verdict"] = SLOWER
        elif c["interval"] is not None and c["interval"][1] <= limit:
            c["verdict"] = OK
        else:
            c["verdict"] = UNSURE
    failed_points = [c for c in comparisons if c["verdict"] == SLOWER]
    return {
        "max_slowdown_pct": max_slowdown_pct,
        "limit": limit,
        "alpha": ALPHA,
        "correction": CORRECTION,
        "playbooks": playbooks,
        "comparisons": comparisons,
        "spans": {span: _worst([c for c in comparisons if c["span"] == span]) for span in names},
        "failed": list(dict.fromkeys(c["span"] for c in failed_points)),
        "failed_points": [f"{c['span']} @ {c['label']}" for c in failed_points],
        "unmatched": unmatched,
    }


def _since_last_step(members: list[tuple], tolerance_pct: float, seed: int) -> tuple[list[tuple], int]:
    """A group's history (its (run, samples), oldest first) from the first run after its last step, and the number
    of steps found in it.
    """
    steps = find_steps([v for _, v in members], tolerance_pct, seed=seed)
    return members[steps[-1]["index"] if steps else 0 :], len(steps)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), never less than
    the one before it, at most 1. Rejecting where the adjusted value is at most alpha bounds the family-wise error.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _worst(comparisons: list[dict]) -> dict:
    verdicts = [c["verdict"] for c in comparisons]
    verdict = SLOWER if SLOWER in verdicts else UNSURE if UNSURE in verdicts else OK
    return {"verdict": verdict, "points": len(comparisons), "slower": verdicts.count(SLOWER)}


def _said(filters: dict) -> str:
    given = dict(filters)
    if given.get("owner") == mine():  # the default: said only when it is someone else's
        del given["owner"]
    elif given.get("owner") is not None:  # uids, said as names
        given["owner"] = [owner_name(uid) for uid in given["owner"]]
    return ", ".join(f"{k}={'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in given.items())


def _groups_said(by_group: dict) -> str:
    if not by_group:
        return "none"
    many = len({g[0] for g in by_group}) > 1
    listed = [group_label(g[0], g[1], many) for g in sort_groups(by_group)]
    return ", ".join(listed[:8]) + (" ..." if len(listed) > 8 else "")
