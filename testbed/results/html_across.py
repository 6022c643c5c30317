"""Several runs on one HTML page (`render_across`): each run's identity, each span's median with its CI run by run
side by side, and the spans pooled. It takes a list of run folders, so any selection (a catalog's, a glob's)
plugs in; the page is self-contained as a single run's is (testbed/results/html_report.py).
"""

from __future__ import annotations

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
from testbed.results.report import load_summary
from testbed.results.stats import summarize


def render_across(run_dirs: Sequence[str | Path], pngs: Sequence[Path] = ()) -> str:
    """One page for several run folders (a catalog's selection): each run's identity, each span's median with
    its CI run by run side by side, the spans pooled over every run's samples (from each run's trials), and the
    figures `pngs` (such as `report --across`'s CDF overlays), embedded.
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
    side = []
    for span in spans:
        row = [span]
        for summary in summaries:
            s = (summary.get("spans") or {}).get(span)
            if not s or not s.get("n"):
                row.append("-")
                continue
            n, p50, ci = span_cells(s)[:3]
            row.append(f"{p50} [{ci}] n={n}")
        side.append(row)
    pooled: dict[str, list[float]] = {}
    for folder in folders:
        for span, values in span_durations(folder).items():
            pooled.setdefault(span, []).extend(values)
    pooled_stats = {span: summarize(pooled[span]) for span in spans if pooled.get(span)}
    title = f"{len(folders)} runs"
    body = [
        f"<h1>{e(title)}</h1>",
        "<h2>Runs</h2>",
        table(
            ["run", "status", "playbook", "inventory", "lab or twin", "seed", "commit", "start (UTC)", "trials"],
            ident,
            cls="text",
        ),
        "<h2>Medians run by run</h2>",
        table(["span", *names], side, "p50 ms [95% CI of the median] n, per run"),
        "<h2>Pooled</h2>",
        spans_html(pooled_stats, f"every sample of the {len(folders)} runs pooled"),
        '<p class="note">Pooling treats the runs as one sample: compare the medians run by run first; pool runs that '
        "differ only by chance (the same playbook, inventory and code).</p>",
    ]
    if pngs:
        body.append(figures_section([Path(p) for p in pngs]))
    return page(title, "".join(body))


def write_across_report(run_dirs: Sequence[str | Path], out: str | Path, pngs: Sequence[Path] = ()) -> Path:
    """Write `render_across` of the run folders (and the figures `pngs`) to `out`; returns the path."""
    return write_text(Path(out), render_across(run_dirs, pngs))
