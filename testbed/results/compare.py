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

import json
import sys
from pathlib import Path
from typing import TextIO

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from testbed.contracts.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from testbed.events.safe_files import owner, read_json
from testbed.results.points import point_key, point_label, point_order
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


def _table(title: str, swept: bool) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("span", overflow="fold")
    if swept:
        table.add_column("sweep point", overflow="fold")
    table.add_column("run")
    table.add_column("n", justify="right")
    table.add_column("p50 ms [95% CI]", justify="right", no_wrap=True)
    table.add_column("max ms", justify="right")
    table.add_column("B/A", justify="right")
    table.add_column("verdict", min_width=12)
    return table


def _add_span(table: Table, name: str, sa: dict, sb: dict, point: str | None) -> None:
    """A span's two lines, A then B (with the sweep point's label when the runs sweep)."""
    if sa.get("n") and sb.get("n"):
        v = verdict(sa, sb)
    else:
        v = "no samples in " + " and ".join(x for x, s in (("A", sa), ("B", sb)) if not s.get("n"))
    style = {FASTER: "green", SLOWER: "red"}.get(v, "")
    first = [name] + ([point] if point is not None else [])
    blank = [""] + ([""] if point is not None else [])
    table.add_row(*first, "A", str(sa.get("n", 0)), _median(sa), _max(sa), _ratio(sa, sb), Text(v, style=style))
    table.add_row(*blank, "B", str(sb.get("n", 0)), _median(sb), _max(sb), "", "", end_section=True)


def _points(summary: dict) -> dict[str, dict]:
    """A summary's sweep points: {key (sorted JSON): its spans}; empty for a run without a sweep."""
    return {
        point_key(p.get("point")): p.get("spans") or {}
        for p in summary.get("sweep") or []
        if isinstance(p, dict) and isinstance(p.get("point"), dict)
    }


def compare_summaries(a: dict, b: dict, label_a: str = "A", label_b: str = "B") -> Group:
    """The comparison as rich renderables: one table of the spans both runs measured (two lines per span,
    A then B), then the spans only one of them measured, then a note on what the verdicts mean.

    Runs that sweep are compared sweep point by sweep point (a point's samples against the same point's): a span's
    samples over every point mix the points, and the two runs' mixes need not be alike.
    """
    spans_a, spans_b = a.get("spans", {}), b.get("spans", {})
    points_a, points_b = _points(a), _points(b)
    parts: list = []
    if a.get("playbook") != b.get("playbook"):
        parts.append(
            Text(
                f"A and B are runs of different playbooks ({a.get('playbook', '?')}, {b.get('playbook', '?')}): "
                "a span of the same name may measure another thing",
                style="yellow",
            )
        )
    if points_a or points_b:
        common_points = sorted((k for k in points_a if k in points_b), key=point_order)
        table = _table(f"A = {label_a}\nB = {label_b}\nsweep point by sweep point", swept=True)
        for name in [n for n in spans_a if n in spans_b]:
            for key in common_points:
                sa, sb = points_a[key].get(name), points_b[key].get(name)
                if sa is not None and sb is not None:
                    _add_span(table, name, sa, sb, point_label(key))
        parts.append(table if common_points else Text("no sweep point measured by both runs"))
        for who, mine, theirs in (("A", points_a, points_b), ("B", points_b, points_a)):
            alone = [point_label(k) for k in mine if k not in theirs]
            if alone:
                parts.append(Text(f"sweep points only in {who} (not compared): {'; '.join(alone)}", style="yellow"))
    else:
        common = [n for n in spans_a if n in spans_b]
        table = _table(f"A = {label_a}\nB = {label_b}", swept=False)
        for name in common:
            _add_span(table, name, spans_a[name], spans_b[name], None)
        parts.append(table if common else Text("no span measured by both runs"))
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
    group = Group(*notes, *compare_summaries(a, b, label_a, label_b).renderables)
    differences = config_differences(_run_info(Path(run_a)), _run_info(Path(run_b)))
    if not differences:
        return group
    shown = differences[:MAX_DIFFERENCES]
    more = f"\n  ... and {len(differences) - len(shown)} more" if len(differences) > len(shown) else ""
    said = Text("configuration A -> B:\n" + "\n".join(f"  {d}" for d in shown) + more, style="yellow")
    return Group(said, *group.renderables)


MAX_DIFFERENCES = 12
# What of run.json is the runs' configuration: what they ran (its ports, pids and clocks differ run by run).
CONFIGURATION = ("playbook", "inventory", "seed", "trials", "emulate", "git_revision")


def config_differences(a: dict, b: dict) -> list[str]:
    """What differs between two runs' run.json, key path by key path (`inventory.devices.ocs1.emulation.
    switching_time_ms: 25.0 -> 40.0`): the inventory's content, the playbook's, the seed, the trials, lab or twin.
    """
    flat_a = _flatten({k: a[k] for k in CONFIGURATION if k in a})
    flat_b = _flatten({k: b[k] for k in CONFIGURATION if k in b})
    out = []
    for key in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(key, "(none)"), flat_b.get(key, "(none)")
        if va != vb:
            out.append(f"{key}: {va} -> {vb}")
    return out


def _flatten(value, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else str(value)}


def _run_info(run_dir: Path) -> dict:
    try:
        info = read_json(run_dir / "run.json")  # no link followed, its size and depth bounded
    except (OSError, ValueError, UserError):
        return {}
    return info if isinstance(info, dict) else {}


def main(a: str | Path, b: str | Path, out: TextIO | None = None) -> int:
    """`testbed compare RUN_A RUN_B`: 0 when both are runs (whatever the comparison says), 2 if not."""
    try:
        renderable = compare_runs(a, b)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_BAD_INPUT
    console = Console(file=out, highlight=False, width=120 if out is not None else None)
    if out is None and not console.is_terminal:  # a CI log, a file: a row per line
        console = Console(highlight=False, width=160)
    console.print(renderable)
    return EXIT_OK
