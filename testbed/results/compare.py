"""`testbed compare RUN_A RUN_B`: two runs side by side, span by span, from their summary.json.

For each span both runs measured: n, the median with its 95 % CI and the max of each run, the ratio of
the medians (B / A), and a verdict that claims no more than the data shows:

- "CIs overlap: no clear difference" when the two medians' 95 % CIs overlap;
- "B faster" / "B slower" only when they do not (B's interval entirely below / above A's);
- "n<6: no CI, cannot tell" when either run has too few samples for a CI of the median.

Non-overlapping 95 % intervals are a conservative test (a difference can be real with overlapping CIs),
which is the right side to err on when quoting a speed-up. Spans measured by one run only are listed
separately. Durations: lower is faster.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from testbed.contracts.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from testbed.events.safe_files import owner
from testbed.results.report import load_summary

OVERLAP = "CIs overlap: no clear difference"
NO_CI = "n<6: no CI, cannot tell"
FASTER = "B faster"
SLOWER = "B slower"


def verdict(a: dict, b: dict) -> str:
    """Compare two span summaries (summary.json entries) by their medians' 95 % CIs."""
    ca, cb = a.get("p50_ci95_ms"), b.get("p50_ci95_ms")
    if not ca or not cb:
        return NO_CI
    if cb[1] < ca[0]:
        return FASTER
    if cb[0] > ca[1]:
        return SLOWER
    return OVERLAP


def _num(ms: float) -> str:
    a = abs(ms)
    return f"{ms:.0f}" if a >= 1000 else f"{ms:.1f}" if a >= 100 else f"{ms:.2f}" if a >= 10 else f"{ms:.3f}"


def _median(s: dict) -> str:
    if not s.get("n"):
        return "-"
    ci = s.get("p50_ci95_ms")
    return f"{_num(s['p50_ms'])} [{_num(ci[0])}-{_num(ci[1])}]" if ci else f"{_num(s['p50_ms'])} [n<6]"


def _max(s: dict) -> str:
    return _num(s["max_ms"]) if s.get("n") else "-"


def _ratio(a: dict, b: dict) -> str:
    if not a.get("n") or not b.get("n"):
        return "-"
    if a["p50_ms"] == 0:
        return "-" if b["p50_ms"] else "1.00"
    return f"{b['p50_ms'] / a['p50_ms']:.2f}"


def compare_summaries(a: dict, b: dict, label_a: str = "A", label_b: str = "B") -> Group:
    """The comparison as rich renderables: one table of the spans both runs measured (two lines per span,
    A then B), then the spans only one of them measured, then a note on what the verdicts mean.
    """
    spans_a, spans_b = a.get("spans", {}), b.get("spans", {})
    common = [n for n in spans_a if n in spans_b]
    table = Table(title=f"A = {label_a}\nB = {label_b}", title_justify="left")
    table.add_column("span", overflow="fold")
    table.add_column("run")
    table.add_column("n", justify="right")
    table.add_column("p50 ms [95% CI]", justify="right", no_wrap=True)
    table.add_column("max ms", justify="right")
    table.add_column("B/A", justify="right")
    table.add_column("verdict", min_width=12)
    for name in common:
        sa, sb = spans_a[name], spans_b[name]
        if sa.get("n") and sb.get("n"):
            v = verdict(sa, sb)
        else:
            v = "no samples in " + " and ".join(x for x, s in (("A", sa), ("B", sb)) if not s.get("n"))
        style = {FASTER: "green", SLOWER: "red"}.get(v, "")
        table.add_row(name, "A", str(sa.get("n", 0)), _median(sa), _max(sa), _ratio(sa, sb), Text(v, style=style))
        table.add_row("", "B", str(sb.get("n", 0)), _median(sb), _max(sb), "", "", end_section=True)
    parts: list = [table] if common else [Text("no span measured by both runs")]
    only_a = [n for n in spans_a if n not in spans_b]
    only_b = [n for n in spans_b if n not in spans_a]
    for who, names, spans in (("A", only_a, spans_a), ("B", only_b, spans_b)):
        if not names:
            continue
        t = Table(title=f"only in {who}", title_justify="left")
        t.add_column("span", overflow="fold")
        t.add_column("n", justify="right")
        t.add_column("p50 ms [95% CI]", justify="right", no_wrap=True)
        t.add_column("max ms", justify="right")
        for n in names:
            t.add_row(n, str(spans[n].get("n", 0)), _median(spans[n]), _max(spans[n]))
        parts.append(t)
    parts.append(
        Text(
            "verdicts compare the 95% CIs of the medians (distribution-free); overlapping CIs do not prove "
            "the runs equal, only that these samples cannot tell them apart. No p99 is compared.",
            style="dim",
        )
    )
    return Group(*parts)


def compare_runs(run_a: str | Path, run_b: str | Path) -> Group:
    """Side-by-side comparison of two run folders; raises UserError for a folder that is not a run."""
    a, b = load_summary(Path(run_a)), load_summary(Path(run_b))
    label_a = f"{a.get('run') or Path(run_a).name} ({a.get('playbook', '?')})"
    label_b = f"{b.get('run') or Path(run_b).name} ({b.get('playbook', '?')})"
    # Whose folder each is: what a run.json says anyone may have written; its owner, nobody but root can forge.
    owners = [(who, run, owner(Path(run))) for who, run in (("A", run_a), ("B", run_b))]
    notes = [Text(f"{who} = {run}: owned by {name}") for who, run, name in owners if name is not None]
    return Group(*notes, compare_summaries(a, b, label_a, label_b))


def main(a: str | Path, b: str | Path, out: TextIO | None = None) -> int:
    """`testbed compare RUN_A RUN_B`: 0 when both are runs (whatever the comparison says), 2 if not."""
    try:
        renderable = compare_runs(a, b)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_BAD_INPUT
    console = Console(file=out, highlight=False, width=120 if out is not None else None)
    console.print(renderable)
    return EXIT_OK
