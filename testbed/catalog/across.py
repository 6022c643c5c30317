"""Statistics across a selection of runs (`testbed report --across`, `testbed trend`): each run's median with its CI
span by span and sweep point by sweep point, each point's samples pooled over the runs, and a span's median run by
run, commit by commit or tag by tag, one series per sweep point (docs/catalog.md). Samples of different sweep points
or playbooks are never pooled together (testbed.catalog.points).

The samples come from the catalog as arrays run by run (`span_columns`); the statistics are the ones a run's own
summary uses (testbed.results.stats.summarize), so a run's row here is its summary.json's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from testbed.catalog.changes import DEFAULT_TOLERANCE_PCT, find_steps
from testbed.catalog.owners import mine, owner_name
from testbed.catalog.points import check_selection, group_label, groups, sort_groups
from testbed.catalog.query import did_you_mean, span_columns, span_counts, unknown_spans
from testbed.contracts.errors import UserError
from testbed.results.stats import summarize

BY = ("date", "commit", "tag")


def across(
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    spans: Iterable[str] | None = None,
    sweep: dict[str, set[str]] | None = None,
    **filters,
) -> dict:
    """The selection's runs, each with `stats` {span: summarize(its samples)} and `points` {span: [{playbook, point,
    label, **summarize}]} (its samples sweep point by sweep point); `groups` {span: [{playbook, point, label, runs,
    **summarize(every run's samples at that point)}]}; `pooled` {span: summarize(every run's samples)} for the spans
    whose samples are of one playbook at one point only (pooling more would mix unlike samples); `spans` the span
    names in the order first measured. `sweep` selects points (--sweep). UserError when nothing is selected.
    """
    runs = span_columns(results_dirs, list(spans) if spans is not None else None, **filters)
    if not runs:
        raise UserError(_nothing_measured(results_dirs, spans, filters))
    wanted = sweep or {}
    check_selection(wanted, [k for r in runs for k in (r.get("sweeps") or {}).values()])
    names: list[str] = []
    for run in runs:
        names.extend(name for name in sorted(run["spans"]) if name not in names)
    many = len({r["playbook"] for r in runs}) > 1
    by_span = {name: groups(runs, name, wanted) for name in names}
    names = [name for name in names if by_span[name]]
    for run in runs:
        run["stats"], run["points"] = {}, {}
        for name in names:
            mine = [(g, v) for g in sort_groups(by_span[name]) for r, v in by_span[name][g] if r is run]
            if not mine:
                continue
            run["stats"][name] = summarize(np.concatenate([v for _, v in mine]))
            run["points"][name] = [
                {"playbook": g[0], "point": json.loads(g[1]), "label": group_label(g[0], g[1], many), **summarize(v)}
                for g, v in mine
            ]
    out_groups = {
        name: [
            {
                "playbook": g[0],
                "point": json.loads(g[1]),
                "label": group_label(g[0], g[1], many),
                "runs": [r["run_id"] for r, _ in by_span[name][g]],
                **summarize(np.concatenate([v for _, v in by_span[name][g]])),
            }
            for g in sort_groups(by_span[name])
        ]
        for name in names
    }
    pooled = {name: {k: v for k, v in out_groups[name][0].items() if k not in ("playbook", "point", "label", "runs")}
              for name in names if len(out_groups[name]) == 1}  # fmt: skip
    return {"runs": runs, "spans": names, "groups": out_groups, "pooled": pooled}


def trend(
    span: str,
    results_dirs: str | Path | Iterable[str | Path] | None = None,
    by: str = "date",
    sweep: dict[str, set[str]] | None = None,
    tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
    **filters,
) -> list[dict]:
    """The span's median and CI run by run, oldest first (`by="date"`), commit by commit (`by="commit"`: each
    commit's runs pooled, commits in the order of their first run), or tag by tag (`by="tag"`: each tag's runs
    pooled; a run of several tags in each), sweep point by sweep point: each series is one playbook at one point
    (`sweep` selects points), never several pooled. Each row: series (its label, "-" without a sweep), playbook,
    point, label, runs (run ids), statuses (each run's: ok, failed, aborted...), started (the first run's),
    git_commit, summarize's keys (n, p50_ms, p50_ci95_ms, ...), and step: None, or, on the first row of a new level
    of a history (by date or commit; testbed.catalog.changes), {ratio, interval, after: the row before it's label}.
    `by="param:NAME"` is a row per value of the runs' --param NAME (numbers in numeric order).
    """
    param = by.partition(":")[2].strip() if by.startswith("param:") else None
    if by not in BY and not param:
        raise UserError(f"--by {by!r}: one of {', '.join(BY)}, or param:NAME (a --param of the runs)")
    runs = span_columns(results_dirs, span, **filters)
    if not runs:
        raise UserError(_nothing_measured(results_dirs, [span], filters))
    wanted = sweep or {}
    check_selection(wanted, [k for r in runs for k in (r.get("sweeps") or {}).values()])
    if by == "tag" or param:
        annotated = _annotations(runs)
    if param:
        _check_param(param, annotated.values())
    grouped = groups(runs, span, wanted)
    many = len({g[0] for g in grouped}) > 1
    rows = []
    for g in sort_groups(grouped):
        keyed: dict[str, list[tuple]] = {}
        for run, values in grouped[g]:
            if by == "date":
                keys = [run["folder"]]
            elif by == "commit":
                keys = [run["git_commit"] or "unknown"]
            elif param:
                keys = [annotated[run["path"]]["params"].get(param, f"(no {param})")]
            else:
                keys = annotated[run["path"]]["tags"] or ["(untagged)"]
            for key in keys:
                keyed.setdefault(key, []).append((run, values))
        history: list[np.ndarray] = []  # the series' samples row by row, for its steps
        for key, members in (_by_value(keyed) if param else keyed).items():
            first = members[0][0]
            if by == "date":
                label = first["run_id"]
            elif by == "commit":
                label = key[:10] + ("+" if any(r["git_dirty"] for r, _ in members) else "")
            else:
                label = key
            rows.append(
                {
                    "series": group_label(g[0], g[1], many),
                    "playbook": g[0],
                    "point": json.loads(g[1]),
                    "label": label,
                    "runs": [r["run_id"] for r, _ in members],
                    "statuses": [r["status"] for r, _ in members],
                    "started": first["started"],
                    "git_commit": first["git_commit"],
                    **summarize(np.concatenate([v for _, v in members])),
                    "step": None,
                }
            )
            history.append(np.concatenate([v for _, v in members]))
        if by in ("date", "commit"):  # a history: where its level stepped (tags and params are no order)
            series_rows = rows[len(rows) - len(history) :]
            for step in find_steps(history, tolerance_pct):
                row = series_rows[step["index"]]
                row["step"] = {"ratio": step["ratio"], "interval": step["interval"],
                               "after": series_rows[step["index"] - 1]["label"]}  # fmt: skip
    return rows


def _annotations(runs: list[dict]) -> dict[str, dict]:
    """Each run's row of select_runs (its tags and params among them) by its folder's path, from the catalog."""
    from testbed.catalog.query import select_runs

    paths = {r["path"] for r in runs}
    dirs = list(dict.fromkeys(r["results"] for r in runs))
    return {r["path"]: r for r in select_runs(dirs, sync_first=False) if r["path"] in paths}


def _check_param(name: str, runs: Iterable[dict]) -> None:
    """UserError when no selected run has the --param `name`: the params they have, the closest first."""
    names = sorted({k for r in runs for k in r["params"]})
    if name not in names:
        listed = ", ".join(names) if names else "none (`testbed run --param KEY=VALUE` gives a run one)"
        raise UserError(f"--by param:{name}: no selected run has the param {name!r}{did_you_mean(name, names)}; "
                        f"their params: {listed}")  # fmt: skip


def _by_value(keyed: dict[str, list]) -> dict[str, list]:
    """A param's values in numeric order when they are all numbers (fibre_m 5, 20, 100), else as first met; the
    runs without the param last.
    """
    given = [k for k in keyed if not k.startswith("(no ")]
    try:
        given.sort(key=float)
    except ValueError:
        pass
    return {k: keyed[k] for k in [*given, *(k for k in keyed if k not in given)]}


def _nothing_measured(results_dirs, spans: Iterable[str] | None, filters: dict) -> str:
    """Why a selection gave no samples: no run selected, or the spans asked for are not among those it measured
    (listed, with the closest to each).
    """
    measured = span_counts(results_dirs, **{k: v for k, v in filters.items() if k != "sync_first"})
    said = f"no run {_described(filters)} measured {_spans_said(spans)}"
    if spans is None or not measured:
        return f"{said}; `testbed runs` lists the runs"
    return f"{said}: " + (unknown_spans(spans, measured, "them") or "")


def _described(filters: dict) -> str:
    given = {k: v for k, v in filters.items() if v not in (None, [], ()) and k != "sync_first"}
    if given.get("owner") == mine():  # the default: said only when it is someone else's
        del given["owner"]
    elif "owner" in given:  # uids, said as names
        given["owner"] = [owner_name(uid) for uid in given["owner"]]
    said = ", ".join(f"{k}={'+'.join(map(str, v)) if isinstance(v, list | tuple) else v}" for k, v in given.items())
    return f"selected by {said}" if given else "in the results folders"


def _spans_said(spans: Iterable[str] | None) -> str:
    return "any span" if spans is None else " or ".join(repr(s) for s in spans)
