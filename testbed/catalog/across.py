"""Statistics across a selection of runs (`testbed report --across`, `testbed trend`): each run's median with its CI
span by span, the spans pooled, and a span's median run by run or commit by commit (docs/catalog.md).

The samples come from the catalog as arrays run by run (`span_columns`); the statistics are the ones a run's own
summary uses (testbed.results.stats.summarize), so a run's row here is its summary.json's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from testbed.catalog.query import span_columns
from testbed.contracts.errors import UserError
from testbed.results.stats import summarize

BY = ("date", "commit")


def across(
    results_dirs: str | Path | Iterable[str | Path] | None = None, spans: Iterable[str] | None = None, **filters
) -> dict:
    """The selection's runs, each with `stats` {span: summarize(its samples)}, and `pooled` {span: summarize(every
    run's samples)}; `spans` the span names in the order first measured. UserError when nothing is selected.
    """
    runs = span_columns(results_dirs, list(spans) if spans is not None else None, **filters)
    if not runs:
        raise UserError(f"no run {_described(filters)} measured {_spans_said(spans)}; `testbed runs` lists the runs")
    names: list[str] = []
    for run in runs:
        names.extend(name for name in sorted(run["spans"]) if name not in names)
        run["stats"] = {name: summarize(values) for name, values in run["spans"].items()}
    pooled = {name: summarize(np.concatenate([r["spans"][name] for r in runs if name in r["spans"]])) for name in names}
    return {"runs": runs, "spans": names, "pooled": pooled}


def trend(
    span: str, results_dirs: str | Path | Iterable[str | Path] | None = None, by: str = "date", **filters
) -> list[dict]:
    """The span's median and CI run by run, oldest first (`by="date"`), or commit by commit (`by="commit"`: each
    commit's runs pooled, commits in the order of their first run). Each row: label, runs (run ids), started (the
    first run's), git_commit, and summarize's keys (n, p50_ms, p50_ci95_ms, ...).
    """
    if by not in BY:
        raise UserError(f"--by {by!r}: one of {', '.join(BY)}")
    runs = span_columns(results_dirs, span, **filters)
    if not runs:
        raise UserError(f"no run {_described(filters)} measured {span!r}; `testbed runs` lists the runs")
    groups: dict[str, list[dict]] = {}
    for run in runs:
        key = run["folder"] if by == "date" else (run["git_commit"] or "unknown")
        groups.setdefault(key, []).append(run)
    rows = []
    for key, members in groups.items():
        first = members[0]
        label = first["run_id"] if by == "date" else key[:10] + ("+" if any(r["git_dirty"] for r in members) else "")
        rows.append(
            {
                "label": label,
                "runs": [r["run_id"] for r in members],
                "started": first["started"],
                "git_commit": first["git_commit"],
                **summarize(np.concatenate([r["spans"][span] for r in members])),
            }
        )
    return rows


def _described(filters: dict) -> str:
    given = {k: v for k, v in filters.items() if v not in (None, [], ()) and k != "sync_first"}
    said = ", ".join(f"{k}={'+'.join(v) if isinstance(v, list | tuple) else v}" for k, v in given.items())
    return f"selected by {said}" if given else "in the results folders"


def _spans_said(spans: Iterable[str] | None) -> str:
    return "any span" if spans is None else " or ".join(repr(s) for s in spans)
