"""Tables of a run's summary, for `testbed report` and for the end of `testbed run`."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.contracts.errors import UserError
from testbed.events.safe_files import read_json_object
from testbed.fabric_service.share_table import framework_share_table
from testbed.results.collective_view import collective_tables
from testbed.results.milestones import milestone_prefixes, milestone_segments


def load_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / "summary.json"
    try:
        return read_json_object(path)
    except FileNotFoundError:
        raise UserError(
            f"{run_dir}: no summary.json here; pass a folder that `testbed run` wrote (results/<timestamp>_<playbook>/)"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the summary: {exc}") from None


def spans_table(spans: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("span")
    for col in ("n", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms", "max ms"):
        table.add_column(col, justify="right")
    for name, s in spans.items():
        if not s.get("n"):
            table.add_row(name, "0", "", "", "", "", "")
            continue
        ci = s.get("p50_ci95_ms")
        p99 = f"{s['p99_ms']:.3f}" + ("" if s.get("p99_reliable") else "*")
        table.add_row(
            name,
            str(s["n"]),
            f"{s['p50_ms']:.3f}",
            f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "n<6",
            f"{s['p90_ms']:.3f}",
            p99,
            f"{s['max_ms']:.3f}",
        )
    return table


def print_summary(console: Console, summary: dict, run_dir: Path | None = None) -> None:
    """The run's tables; with its folder, those read from its events too (a collective sweep's)."""
    trials = summary.get("trials", {})
    console.print(
        f"[bold]{summary.get('playbook')}[/]  run {summary.get('run')}  status "
        f"[{'green' if summary.get('status') == 'ok' else 'red'}]{summary.get('status')}[/]  trials "
        f"{trials.get('ok', 0)} ok / {trials.get('failed', 0)} failed of {trials.get('planned', '?')}"
    )
    for table in milestone_tables(summary):  # failover segments in milestone order, then the total
        console.print(table)
    if summary.get("spans"):
        console.print(spans_table(summary["spans"], "measured spans (all trials)"))
        if any(not s.get("p99_reliable", True) for s in summary["spans"].values() if s.get("n")):
            console.print(
                "[dim]* fewer than 100 samples: p99 is close to the maximum of a few and is not a "
                "stable estimate; quote the median with its CI and the max.[/]"
            )
    for table in collective_tables(run_dir, summary) if run_dir is not None else ():
        console.print(table)  # a collective sweep's sizes x cases, its crossovers, its reconfigurations
    share = framework_share_table(summary)  # the fabric service's changes: how much of each is the framework's
    if share is not None:
        console.print(share)
    if summary.get("health"):
        table = Table(title="hosts", title_justify="left")
        for col in ("host", "health", "GPUs", "model", "lost", "Xid"):
            table.add_column(col)
        for host, h in summary["health"].items():
            gpus = h.get("gpus", [])
            lost = [str(g.get("index")) for g in gpus if g.get("lost")]
            names = sorted({g.get("name") or "?" for g in gpus if not g.get("lost")})
            xids = h.get("xids", [])
            table.add_row(
                host,
                "[green]ok[/]" if h.get("ok") else "[red]FAIL[/]",
                str(len(gpus)),
                ", ".join(names),
                ", ".join(lost) or "-",
                str(len(xids)) if xids else "-",
            )
        console.print(table)
    by_step = summary.get("by_step", {})
    headline = {s: v for s, v in by_step.items() if s.endswith((".total", ".latency"))} or by_step
    for span, steps in headline.items():
        console.print(spans_table(steps, f"{span} per step"))
    for device, c in summary.get("crosstalk", {}).items():
        table = Table(
            title=f"{device}: worst crosstalk per output port over the run ({c['source']})", title_justify="left"
        )
        table.add_column("output port")
        table.add_column("crosstalk dB", justify="right")
        table.add_column("extinction dB", justify="right")
        for port, db in c["worst_db"].items():
            table.add_row(str(port), f"{db:.1f}", f"{-db:.1f}")
        console.print(table)
    for point in summary.get("sweep", []):
        label = ", ".join(f"{k}={v}" for k, v in point["point"].items())
        console.print(spans_table(point["spans"], f"sweep point {label}"))
    truth = summary.get("ground_truth")
    if truth:
        print_ground_truth(console, truth)


def print_ground_truth(console: Console, truth: dict) -> None:
    """The measured failover against the twin's own account of it (testbed/results/accuracy.py)."""
    spans = {
        "error (measured - truth)": truth["error_ms"],
        "|error|": truth["abs_error_ms"],
        "start: fault_injected - fault applied": truth["start_error_ms"],
        "end: first_step seen - line written": truth["end_error_ms"],
    }
    console.print(
        spans_table(
            {k: v for k, v in spans.items() if v.get("n")},
            f"failover latency against the twin's ground truth ({truth['matched']} of {truth['failovers']} matched)",
        )
    )
    for row in truth.get("unmatched", []):
        console.print(f"[yellow]trial {row['trial']}: no ground truth: {row['reason']}[/]")
    trigger = truth.get("trigger")
    if trigger == "real-time":
        console.print("The twin fired every fault at real-time priority (SCHED_FIFO).")
    elif trigger in ("normal", "mixed"):
        console.print(
            f"[yellow]The twin fired {'the' if trigger == 'normal' else 'some'} faults at normal priority: on a busy "
            "machine such a fault can land a few ms after its moment, and that lateness is in the error above "
            "(the start row). To fire at real-time priority, run with CAP_SYS_NICE or an rtprio limit of 1 or more "
            "(/etc/security/limits.conf).[/]"
        )


def milestone_tables(summary: dict) -> list:
    """The milestone tables for `testbed report`: per failover measure (usually just `failover`), its
    spans of summary.json in milestone order (segments, merged segments, then the total), as rich Tables
    with n, p50 and its CI, p90, p99 (starred below 100 samples) and max. Empty when the run measured no
    failover.
    """
    spans = summary.get("spans", {})
    tables = []
    for prefix in milestone_prefixes(spans):
        segments = milestone_segments(spans, prefix)
        ordered = {segment: spans[f"{prefix}.{segment}"] for segment in segments}
        tables.append(spans_table(ordered, f"{prefix} milestones (segment = previous milestone -> this one; ms)"))
    return tables


def milestone_table(summary: dict):
    """The first of `milestone_tables` (the failover of a usual playbook), or None."""
    tables = milestone_tables(summary)
    return tables[0] if tables else None
