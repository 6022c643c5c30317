"""A run as one self-contained HTML file to attach to a message (`testbed report RUN --html [FILE]`).

What the file holds: the run's identity and provenance, the latency tables as `testbed report` prints them
(the same spans, columns and rounding), the milestones of every failover as an inline SVG timeline with their
times, the faults and how each went, and every figure of the run embedded as a base64 PNG.

Self-contained means it opens from a mail attachment with no server and no network: no external style,
script, font or image, and no http(s) address in it. A Content-Security-Policy meta says so to the browser
too (`default-src 'none'`): even a string from the run that escaped our escaping could neither run script nor
fetch anything. The one script allowed is ours, by its hash: it marks each figure with the width it decoded
to and says so on the page when one did not decode (docs/reports.md).

Every string taken from the run (playbook, step and fault names, error texts) goes through `html.escape`.
Several runs on one page: testbed/results/html_across.py.
"""

from __future__ import annotations

import base64
import hashlib
import html
import tempfile
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.events import read_faults, read_jsonl
from testbed.events.safe_files import (
    MAX_FIGURE_BYTES,
    UnsafeFile,
    atomic_writer,
    owner,
    read_bytes,
    read_json,
    writable_by_us,
)
from testbed.results.milestones import (
    MILESTONES,
    SEGMENT_COLOURS,
    milestone_prefixes,
    milestone_segments,
    segment_colour,
    segments_of,
    trial_milestones,
)
from testbed.results.report import load_summary

DEFAULT_FILE = "report.html"
TIMELINE_MAX_TRIALS = 40  # rows of the SVG timeline; the table below it lists every trial

# Ours, allowed by its hash in the CSP: each <img> gets data-natural-width once decoded, and a figure that did
# not decode says so in place of a blank.
_IMAGE_CHECK = (
    "for (const img of document.images) {"
    " const mark = () => { img.dataset.naturalWidth = String(img.naturalWidth);"
    " if (!img.naturalWidth) { const p = document.createElement('p'); p.className = 'broken';"
    " p.textContent = 'this figure did not decode: ' + img.alt; img.after(p); } };"
    " if (img.complete) { mark(); } else { img.addEventListener('load', mark); img.addEventListener('error', mark); }"
    " }"
)

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 75em; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th:first-child, td:first-child, table.kv td, table.kv th, table.text td, table.text th { text-align: left; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
.ok { color: #176317; } .bad { color: #a31515; font-weight: bold; } .note { color: #666; font-size: 0.9em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.broken { color: #a31515; } svg text { font: 11px system-ui, sans-serif; }
"""


def e(value: object) -> str:
    """Text from the run, escaped for HTML text and attribute values alike."""
    return html.escape("" if value is None else str(value), quote=True)


# --- reading the run ---------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        value = read_json(path)  # never through a link, from a FIFO, or too large or deep
    except (OSError, UnsafeFile):  # missing or damaged: the page shows what the other files say
        return {}
    return value if isinstance(value, dict) else {}


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return read_jsonl(path).records if path.is_file() else []


def _utc(wall: float | None) -> str:
    if wall is None:
        return ""
    return datetime.fromtimestamp(float(wall), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def provenance(run_dir: Path, summary: dict, events: list[dict]) -> list[tuple[str, str]]:
    """(label, value) rows of who ran what, where and when: from run.json, the summary and the run's events."""
    run = _read_json(run_dir / "run.json")
    playbook, inventory = _mapping(run.get("playbook")), _mapping(run.get("inventory"))
    host, versions = _mapping(run.get("host")), _mapping(run.get("versions"))
    trials = summary.get("trials", {})
    start = next((ev.get("wall") for ev in events if ev.get("op") == "run.start"), None)
    if start is None:
        start = (run.get("clock") or {}).get("wall_start")
    end = next(
        (ev.get("wall") for ev in reversed(events) if ev.get("op") in ("run.end", "run.failed", "run.aborted")), None
    )
    if end is None and events:
        end = events[-1].get("wall")
    duration = f" ({float(end) - float(start):.1f} s)" if start is not None and end is not None else ""
    where = "twin (emulated)" if run.get("emulate") else ("lab" if run else "")
    if run.get("emulate") is False and run.get("ray_address"):
        where += f", Ray cluster {run['ray_address']}"
    rows = [
        ("run", summary.get("run") or run.get("run") or run_dir.name),
        ("status", summary.get("status") or run.get("status")),
        (
            "playbook",
            " ".join(
                filter(
                    None,
                    [
                        summary.get("playbook") or playbook.get("name"),
                        f"({run['playbook_file']})" if run.get("playbook_file") else "",
                    ],
                )
            ),
        ),
        ("description", playbook.get("description")),
        (
            "inventory",
            " ".join(
                filter(None, [inventory.get("name"), f"({run['inventory_file']})" if run.get("inventory_file") else ""])
            ),
        ),
        ("lab or twin", where),
        ("seed", run.get("seed", playbook.get("seed"))),
        ("trials", f"{trials.get('ok', 0)} ok / {trials.get('failed', 0)} failed of {trials.get('planned', '?')}"),
        ("git commit", run.get("git_revision")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("user@host", f"{host['user']}@{host['hostname']}" if host.get("user") and host.get("hostname") else ""),
        ("folder owned by", owner(run_dir)),  # shown only when it is another account's
        ("start (UTC)", _utc(start)),
        ("end (UTC)", _utc(end) + duration if end is not None else ""),
        ("error", run.get("error")),
    ]
    return [(label, str(value)) for label, value in rows if value not in (None, "")]


def span_cells(s: dict) -> list[str]:
    """One span's cells as the text report prints them (testbed/results/report.py `spans_table`)."""
    if not s.get("n"):
        return ["0", "", "", "", "", ""]
    ci = s.get("p50_ci95_ms")
    return [
        str(s["n"]),
        f"{s['p50_ms']:.3f}",
        f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "n<6",
        f"{s['p90_ms']:.3f}",
        f"{s['p99_ms']:.3f}" + ("" if s.get("p99_reliable") else "*"),
        f"{s['max_ms']:.3f}",
    ]


SPAN_COLUMNS = ("span", "n", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms", "max ms")


def _ordered_milestone_spans(spans: dict, prefix: str) -> dict:
    return {f"{prefix}.{segment}": spans[f"{prefix}.{segment}"] for segment in milestone_segments(spans, prefix)}


def faults(events: list[dict]) -> list[dict]:
    """Each fault the run injected, with how its injection and its heal went (testbed/events/faults.py)."""
    shown = {"ok": "ok", "fail": "failed", "info": "failed"}
    return [
        {
            "trial": f.trial,
            "step": f.step,
            "fault": f.key,
            "kind": f.kind,
            "target": f.device or f.target,
            "injected": shown.get(f.injected or "", "pending"),
            "healed": shown.get(f.healed or "", "never"),
            "inject_ns": f.inject_ns,
            "heal_ns": f.heal_ns,
            "error": "; ".join(filter(None, [f.inject_error, f.heal_error and f"heal: {f.heal_error}"])),
        }
        for f in read_faults(events)
    ]


# --- rendering ---------------------------------------------------------------------------------------------------


def table(columns: Sequence[str] | None, rows: Iterable[Sequence[str]], caption: str = "", cls: str = "") -> str:
    """A table of escaped cells; without columns, no header row (a key-value table)."""
    head = "<thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in columns) + "</tr></thead>" if columns else ""
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return f"<table{attr}>{cap}{head}<tbody>{body}</tbody></table>"


def spans_html(spans: dict, caption: str) -> str:
    return table(SPAN_COLUMNS, ([name, *span_cells(s)] for name, s in spans.items()), caption)


def latency_section(summary: dict) -> str:
    spans = summary.get("spans") or {}
    parts = ["<h2>Latency</h2>"]
    in_milestones: set[str] = set()
    for prefix in milestone_prefixes(spans):
        ordered = _ordered_milestone_spans(spans, prefix)
        in_milestones |= set(ordered)
        parts.append(spans_html(ordered, f"{prefix} milestones (segment = previous milestone -> this one; ms)"))
    # Each span's numbers once: those of a milestone table are not repeated in the table of every span
    others = {name: s for name, s in spans.items() if name not in in_milestones}
    if others:
        what = "other measured spans" if in_milestones else "measured spans"
        parts.append(spans_html(others, f"{what} (all trials)"))
    if spans:
        if any(not s.get("p99_reliable", True) for s in spans.values() if s.get("n")):
            parts.append(
                '<p class="note">* fewer than 100 samples: p99 is close to the maximum of a few and is not a '
                "stable estimate; quote the median with its CI and the max.</p>"
            )
    else:
        parts.append('<p class="note">This run measured no span.</p>')
    by_step = summary.get("by_step") or {}
    headline = {s: v for s, v in by_step.items() if s.endswith((".total", ".latency"))} or by_step
    for span, steps in headline.items():
        if isinstance(steps, dict) and len(steps) > 1:  # one step's numbers are the span's, in the table above
            parts.append(spans_html(steps, f"{span} per step"))
    points = summary.get("sweep") or []
    if points:  # one table a point: folded, so the page is not thousands of pixels of tables (the figure has them)
        summary_line = f"every span at each of the {len(points)} sweep points"
        parts.append(f'<details class="points"><summary>{summary_line}</summary>')
        for point in points:
            label = ", ".join(f"{k}={v}" for k, v in (point.get("point") or {}).items())
            parts.append(spans_html(point.get("spans") or {}, f"sweep point {label}"))
        parts.append("</details>")
    truth = summary.get("ground_truth")
    if truth:
        rows = {
            "error (measured - truth)": truth.get("error_ms", {}),
            "|error|": truth.get("abs_error_ms", {}),
            "start: fault_injected - fault applied": truth.get("start_error_ms", {}),
            "end: first_step seen - line written": truth.get("end_error_ms", {}),
        }
        parts.append(
            spans_html(
                {k: v for k, v in rows.items() if v.get("n")},
                f"failover latency against the twin's ground truth "
                f"({truth.get('matched')} of {truth.get('failovers')} matched)",
            )
        )
    return "".join(parts)


def timeline_svg(per_trial: dict[int, dict[str, int]]) -> str:
    """One row per trial: its failover segments as coloured bars from fault_injected (0 ms), milestones ticked."""
    rows = [(trial, segments_of(found)) for trial, found in per_trial.items()]
    rows = [(t, [s for s in segs if s["segment"] != "total"]) for t, segs in rows]
    rows = [(t, segs) for t, segs in rows if segs][:TIMELINE_MAX_TRIALS]
    if not rows:
        return ""
    span_ms = max((segs[-1]["end_ns"] - per_trial[t][segs[0]["from"]]) / 1e6 for t, segs in rows) or 1.0
    left, width, row_h, top = 70, 800, 22, 24
    height = top + row_h * len(rows) + 40
    scale = width / span_ms
    out = [
        f'<svg role="img" aria-label="failover timeline" width="{left + width + 20}" height="{height}" '
        f'viewBox="0 0 {left + width + 20} {height}">'
    ]
    for i, (trial, segs) in enumerate(rows):
        y = top + i * row_h
        t0 = per_trial[trial][segs[0]["from"]]
        out.append(f'<text x="4" y="{y + 14}">trial {e(trial)}</text>')
        for seg in segs:
            x = left + (seg["start_ns"] - t0) / 1e6 * scale
            w = max(seg["ms"] * scale, 1.0)
            colour = segment_colour(seg["segment"])
            out.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{colour}">'
                f"<title>{e(seg['from'])} -&gt; {e(seg['to'])}: {seg['ms']:.3f} ms</title></rect>"
            )
    axis_y = top + row_h * len(rows) + 12
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#444"/>')
    for k in range(6):
        ms = span_ms * k / 5
        x = left + ms * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{ms:.0f} ms</text>')
    legend_x = left
    shown = {seg["segment"].split("+")[0] for _, segs in rows for seg in segs}
    for name in [n for n in SEGMENT_COLOURS if n in shown]:  # the segments these trials have, in order
        colour = segment_colour(name)
        out.append(f'<rect x="{legend_x}" y="4" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{legend_x + 14}" y="13">{e(name)}</text>')
        legend_x += 14 + 8 * len(name) + 12
    out.append("</svg>")
    return "".join(out)


def milestones_section(events: list[dict]) -> str:
    per_trial = {t: found for t, found in trial_milestones(events).items() if len(found) >= 2}
    if not per_trial:
        return ""
    parts = [
        "<h2>Failover milestones</h2>",
        '<p class="note">Each failover from fault_injected (0 ms) to first_step on the spare; a segment runs from '
        "the previous milestone to the next (hover a bar for its time).</p>",
        timeline_svg(per_trial),
    ]
    if len(per_trial) > TIMELINE_MAX_TRIALS:
        parts.append(f'<p class="note">The timeline shows the first {TIMELINE_MAX_TRIALS} trials; the table, all.</p>')
    present = [m for m in MILESTONES if any(m in found for found in per_trial.values())]
    rows = []
    for trial, found in per_trial.items():
        t0 = found.get(MILESTONES[0], min(found.values()))
        rows.append([str(trial), *(f"{(found[m] - t0) / 1e6:.3f}" if m in found else "-" for m in present)])
    parts.append(table(["trial", *present], rows, "ms since fault_injected, per milestone"))
    return "".join(parts)


def faults_section(events: list[dict]) -> str:
    rows = faults(events)
    if not rows:
        return ""
    trial_status = {
        ev.get("trial"): (ev.get("data") or {}).get("status", "") for ev in events if ev.get("op") == "trial.end"
    }
    body = []
    for r in rows:
        held = f"{(r['heal_ns'] - r['inject_ns']) / 1e6:.1f}" if r["heal_ns"] and r["inject_ns"] else ""
        body.append(
            [
                "" if r["trial"] is None else str(r["trial"]),
                r["step"] or "",
                r["fault"] or "",
                r["kind"] or "",
                r["target"] or "",
                r["injected"],
                r["healed"],
                held,
                trial_status.get(r["trial"], ""),
                r["error"],
            ]
        )
    columns = ["trial", "step", "fault", "kind", "target", "injected", "healed", "active ms", "trial status", "error"]
    return "<h2>Faults</h2>" + table(columns, body, "each fault injected, and how it went", cls="text")


def _png_data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figures_section(pngs: Sequence[Path]) -> str:
    """Each figure embedded; one that is a link, not a regular file, or too large is named, not embedded (a PNG
    linked to a file the reader may read and the folder's writer may not would otherwise be handed to them).
    """
    if not pngs:
        return ""
    parts = ["<h2>Figures</h2>"]
    for png in pngs:
        try:
            data = read_bytes(png, MAX_FIGURE_BYTES)
        except (UnsafeFile, OSError) as exc:
            parts.append(f'<p class="broken">{e(png.name)}: not embedded: {e(exc)}</p>')
            continue
        parts.append(
            f'<figure><img src="{_png_data_uri(data)}" alt="{e(png.name)}">'
            f"<figcaption>{e(png.name)}</figcaption></figure>"
        )
    return "".join(parts)


def page(title: str, body: str) -> str:
    """The whole document: our style inline, our one script allowed by its hash, nothing fetched."""
    digest = base64.b64encode(hashlib.sha256(_IMAGE_CHECK.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}<script>{_IMAGE_CHECK}</script></body></html>\n"
    )


def label_rows(labels: dict | None) -> list[tuple[str, str]]:
    """The rows that tell a run apart from its playbook's other runs (testbed.catalog.folder.run_labels): the
    inventory by content digest (a copy with a slower switch under the same name is another), tags, params, notes.
    """
    if not labels:
        return []
    rows = []
    if labels.get("inventory_digest"):
        rows.append(("inventory content", f"{labels.get('inventory') or '?'}@{labels['inventory_digest'][:12]}"))
    rows.append(("tags", " ".join(labels.get("tags") or []) or "-"))
    params = labels.get("params") or {}
    rows.append(("params", " ".join(f"{k}={v}" for k, v in params.items()) or "-"))
    rows += [("note", str(note.get("text", ""))) for note in labels.get("notes") or [] if isinstance(note, dict)]
    if labels.get("annotations_error"):
        rows.append(("tags and notes", f"not read: {labels['annotations_error']}"))
    return rows


def render_run(run_dir: str | Path, pngs: Sequence[Path] | None = None, labels: dict | None = None) -> str:
    """The HTML page of one run folder; `pngs` the figures to embed (default: every PNG in the folder); `labels`
    the run's inventory digest, tags, params and notes, as the catalog reads them (the report command passes them).
    """
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    events = read_events(run_dir)
    if pngs is None:
        pngs = sorted(run_dir.glob("*.png"))
    status = summary.get("status")
    title = f"{summary.get('playbook') or run_dir.name}: run {summary.get('run') or run_dir.name}"
    cls = "ok" if status == "ok" else "bad"
    body = [
        f'<h1>{e(title)} <span class="{cls}">{e(status)}</span></h1>',
        "<h2>Run</h2>",
        table(None, provenance(run_dir, summary, events) + label_rows(labels), cls="kv"),
        figures_section(pngs),  # before the long tables: what a reader looks at first
        latency_section(summary),
        milestones_section(events),
        faults_section(events),
        f'<p class="note">Written by testbed report --html from {e(run_dir.name)}.</p>',
    ]
    return page(title, "".join(body))


def write_run_report(run_dir: str | Path, out: str | Path | None = None, plots: bool = True) -> Path:
    """Write the run's HTML report (default RUN/report.html), drawing its figures first; returns the path."""
    run_dir = Path(run_dir)
    load_summary(run_dir)  # not a run: the user's mistake, said before any figure is drawn
    ours = writable_by_us(run_dir)
    if out is None and not ours:
        raise UserError(f"{run_dir}: {_not_ours(run_dir)}: the report is not written into it; pass --html FILE")
    if not plots:
        return write_text(Path(out) if out else run_dir / DEFAULT_FILE, render_run(run_dir))
    from testbed.results.plots import write_plots

    if ours:
        write_plots(run_dir)
        return write_text(Path(out) if out else run_dir / DEFAULT_FILE, render_run(run_dir))
    # Another's folder, or one we may not write: its figures are drawn in a private folder of ours, embedded,
    # and gone with it; nothing is written into the run's.
    with tempfile.TemporaryDirectory(prefix="testbed-figures-") as drawn:
        pngs = write_plots(run_dir, drawn)
        return write_text(Path(str(out)), render_run(run_dir, sorted(pngs)))


def _not_ours(folder: Path) -> str:
    name = owner(folder)
    return f"owned by {name}" if name else "not writable by you"


def write_text(path: Path, text: str) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(path) as f:
            f.write(text.encode("utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot write the report: {exc}; pass --html FILE to write it elsewhere") from None
    return path
