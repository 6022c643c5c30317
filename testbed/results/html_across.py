"""Several runs on one HTML page (`render_across`): each run's identity, the figures, each span's median with its CI
a row per run (and sweep point), and the spans pooled one playbook at one sweep point at a time. It takes a list of
run folders, so any selection (a catalog's, a glob's) plugs in; the page is self-contained as a single run's is
(testbed/results/html_report.py).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.results.html_report import (
    e,
    figures_section,
    page,
    provenance,
    read_events,
    span_cells,
    spans_html,
    table,
    write_text,
)
from testbed.results.plots import span_durations
from testbed.results.points import NO_SWEEP, point_key, point_label, point_order
from testbed.results.report import load_summary
from testbed.results.stats import summarize


def render_across(run_dirs: Sequence[str | Path], pngs: Sequence[Path] = ()) -> str:
    """One page for several run folders (a catalog's selection): each run's identity, each span's median with
    its CI, a row per run (and per sweep point, for a run that sweeps), the samples pooled over the runs (from each
    run's trials) one playbook at one sweep point at a time, never two points together, and the figures `pngs`
    (such as `report --across`'s CDF overlays), embedded.
    """
    folders = [Path(d) for d in run_dirs]
    if not folders:
        raise UserError("no runs to report on: the selection is empty")
    summaries = [load_summary(d) for d in folders]
    names = [s.get("run") or d.name for s, d in zip(summaries, folders, strict=True)]
    ident = []
    for folder, summary in zip(folders, summaries, strict=True):
        facts = dict(provenance(folder, summary, read_events(folder)))
        ident.append(
            [facts.get(k, "") for k in ("run", "status", "playbook", "inventory", "lab or twin", "seed")]
            + [facts.get("git commit", "")[:12], facts.get("start (UTC)", ""), facts.get("trials", "")]
        )
    spans: list[str] = []
    for summary in summaries:
        spans.extend(name for name in summary.get("spans") or {} if name not in spans)
    swept = any(summary.get("sweep") for summary in summaries)
    side = []
    for name, summary in zip(names, summaries, strict=True):
        points = [(point_label(p.get("point")), p.get("spans") or {}) for p in summary.get("sweep") or []]
        for label, by_span in points or [("-", summary.get("spans") or {})]:
            row = [name, *([label] if swept else [])]
            for span in spans:
                s = by_span.get(span)
                if not s or not s.get("n"):
                    row.append("-")
                    continue
                n, p50, ci = span_cells(s)[:3]
                row.append(f"{p50} [{ci}] n={n}")
            side.append(row)
    playbooks = {s.get("playbook") for s in summaries}
    pooled: dict[tuple[str, str, str], list[float]] = {}
    for folder, summary in zip(folders, summaries, strict=True):
        for (span, key), values in _point_durations(folder).items():
            pooled.setdefault((str(summary.get("playbook")), key, span), []).extend(values)
    groups = sorted({(playbook, key) for playbook, key, _ in pooled}, key=lambda g: (g[0], point_order(g[1])))
    title = f"{len(folders)} runs"
    body = [
        f"<h1>{e(title)}</h1>",
        "<h2>Runs</h2>",
        table(
            ["run", "status", "playbook", "inventory", "lab or twin", "seed", "commit", "start (UTC)", "trials"],
            ident,
            cls="text",
        ),
    ]
    if pngs:
        body.append(figures_section([Path(p) for p in pngs]))
    body += [
        "<h2>Medians run by run</h2>",
        table(
            ["run", *(["sweep point"] if swept else []), *spans],
            side,
            "p50 ms [95% CI of the median] n, per run" + (" and sweep point" if swept else ""),
        ),
        "<h2>Pooled</h2>",
    ]
    for playbook, key in groups:
        said = " and ".join(
            x for x in (f"playbook {playbook}" if len(playbooks) > 1 else "", point_label(key) if swept else "") if x
        )
        stats = {span: summarize(v) for span in spans if (v := pooled.get((playbook, key, span)))}
        caption = f"every sample of the {len(folders)} runs pooled" + (f", {said}" if said else "")
        body.append(spans_html(stats, caption))
    body.append(
        '<p class="note">Pooling treats the runs as one sample: compare the medians run by run first; pool runs that '
        "differ only by chance (the same playbook, inventory and code). Sweep points and playbooks are pooled each on "
        "its own, never together.</p>"
    )
    return page(title, "".join(body))


def _point_durations(folder: Path) -> dict[tuple[str, str], list[float]]:
    """A run's samples by (span, sweep point key), from its trials.csv; a run without one (it ended before writing
    it) has its spans' samples at the point "{}".
    """
    trials_csv = folder / "trials.csv"
    if not trials_csv.is_file():
        return {(span, NO_SWEEP): values for span, values in span_durations(folder).items()}
    out: dict[tuple[str, str], list[float]] = {}
    with open(trials_csv, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                key = point_key(json.loads(row.get("sweep") or NO_SWEEP))
                out.setdefault((row["span"], key), []).append(float(row["duration_ms"]))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def write_across_report(run_dirs: Sequence[str | Path], out: str | Path, pngs: Sequence[Path] = ()) -> Path:
    """Write `render_across` of the run folders (and the figures `pngs`) to `out`; returns the path."""
    return write_text(Path(out), render_across(run_dirs, pngs))
