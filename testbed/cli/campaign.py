"""Commands over a selection of runs from the catalog (docs/catalog.md): `testbed report --across`, `testbed trend`,
`testbed gate`. A selection is what `testbed runs` filters by (testbed/cli/runs.py); gate's two selections are
KEY=VALUE items (testbed.catalog.gate.parse_selection).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.cli.runs import add_selection_options, selection_filters
from testbed.contracts.errors import EXIT_EXPERIMENT_FAILED, EXIT_OK, UserError


def add_across_options(p: argparse.ArgumentParser) -> None:
    """What `testbed report` takes for --across: the selection, which spans to plot, where the figures go."""
    p.add_argument(
        "--across", action="store_true", help="report on every run the selection options select (no RUN_DIR)"
    )
    add_selection_options(p)
    p.add_argument("--span", action="append", help="with --across: only this span (repeat); CDFs of each")
    _sweep_option(p)
    _out_option(p, "the run's folder; with --across, the current folder")


def add_parsers(sub) -> None:
    p = sub.add_parser("spans", help="list the spans the selected runs measured, with how many runs and samples")
    add_selection_options(p)
    p.add_argument("--json", action="store_true", help="print {span: {runs, samples}} as JSON")

    p = sub.add_parser("trend", help="a span's median and CI run by run (or commit by commit), a table and a plot")
    p.add_argument("span", metavar="SPAN", help="a span's name, e.g. reconfig.total")
    add_selection_options(p)
    p.add_argument(
        "--by",
        default="date",
        metavar="date|commit|tag|param:NAME",
        help="a point per run (date), per commit, per tag or per value of a --param NAME of the runs (each one's "
        "runs pooled); a series per sweep point",
    )
    _sweep_option(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    _out_option(p)

    from testbed.catalog.selection_keys import DEFAULT_MAX_SLOWDOWN_PCT, KEYS

    p = sub.add_parser(
        "gate",
        help="exit 1 when a span got slower from the baseline runs to the candidate runs beyond noise (CI pipelines)",
        description="Selections are KEY=VALUE items, comma-separated or repeated: "
        f"{', '.join(KEYS)}; lab and twin alone. E.g. --baseline tag=before --candidate tag=after,twin. "
        "docs/catalog.md states the statistics.",
    )
    p.add_argument("spans", nargs="+", metavar="SPAN")
    p.add_argument(
        "--baseline",
        action="append",
        metavar="KEY=VALUE",
        help="the runs to compare with (with --against-trend: the history, default every run of yours)",
    )
    p.add_argument("--candidate", action="append", required=True, metavar="KEY=VALUE", help="the runs under test")
    p.add_argument(
        "--max-slowdown",
        type=float,
        default=DEFAULT_MAX_SLOWDOWN_PCT,
        metavar="PCT",
        help=f"the slowdown tolerated, in percent (default {DEFAULT_MAX_SLOWDOWN_PCT:g})",
    )
    p.add_argument(
        "--results",
        action="append",
        metavar="DIR",
        help="a results folder (repeat for several; default ./results), for both selections",
    )
    _sweep_option(p)
    p.add_argument(
        "--against-trend",
        action="store_true",
        help="compare with the baseline's runs since the last step of each span's history (as trend finds steps), "
        "the candidate's runs left out of it",
    )
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument(
        "--webhook",
        metavar="URL",
        help="when the gate fails, POST a JSON body saying what failed, with its figures, to this http(s) URL",
    )


def _sweep_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=VALUE",
        help="only these sweep points (repeat; a key given twice: either value), e.g. --sweep mode=on-demand",
    )


def _out_option(p: argparse.ArgumentParser, default: str = "the current folder") -> None:
    p.add_argument("--out", metavar="DIR", help=f"folder for the figures (default: {default})")


def _figures_to(out: Path, draw):
    """Draw figures into `out` with `draw()`; a folder that cannot be written is the user's mistake (exit 2)."""
    try:
        return draw()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write the figures there ({exc.strerror or exc})") from None


def _html_target(html: str, out: Path, default: str) -> Path:
    """--html's file: as given, DEFAULT in it when it is a folder, DEFAULT in --out's folder when not given."""
    target = Path(html) if html else out / default
    return target / default if target.is_dir() else target


def _dirs(args) -> list[Path]:
    from testbed.catalog.query import results_paths

    return results_paths(args.results or None)


def _out_dir(args) -> Path:
    # As `testbed export`: where the user is (a results folder holds run folders only; scripts list it).
    return Path(args.out) if args.out else Path.cwd()


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ci(s: dict) -> str:
    ci = s.get("p50_ci95_ms")
    return f"{ci[0]:.4f}-{ci[1]:.4f}" if ci else "n<6"


def _wide(console: Console) -> Console:
    """The console, or, when the output is not a terminal (a CI log, a file), one wide enough for a row per line."""
    return console if console.is_terminal else Console(highlight=False, width=160, file=console.file)


def _print_paths(console: Console, paths) -> None:
    for path in paths:
        console.print(f"wrote {path}", soft_wrap=True, markup=False, highlight=False)


# --- report --across -----------------------------------------------------------------------------------------


def cmd_report_across(args, console: Console) -> int:
    from testbed.catalog.across import across
    from testbed.catalog.figures import plot_cdf_overlay
    from testbed.catalog.points import parse_sweep

    console = _wide(console)
    if args.run_dir is not None:
        raise UserError(f"give a run folder ({args.run_dir}) or --across and a selection, not both")
    dirs = _dirs(args)
    result = across(dirs, args.span, sweep=parse_sweep(args.sweep), **selection_filters(args, mine_by_default=True))
    runs = result["runs"]
    if args.json:
        rows = [{k: v for k, v in r.items() if k not in ("spans", "trials", "sweeps")} for r in runs]
        print(json.dumps({"runs": rows, "groups": result["groups"], "pooled": result["pooled"]}, indent=2))
        return EXIT_OK
    for span in result["spans"]:
        swept = len(result["groups"][span]) > 1 or result["groups"][span][0]["label"] != "-"
        table = Table(
            title=f"{span}: median run by run{', sweep point by sweep point' if swept else ''}", title_justify="left"
        )
        table.add_column("run", overflow="fold")
        if swept:
            table.add_column("sweep point", overflow="fold")
        for name in ("status", "tags", "started (UTC)", "commit", "n", "p50 ms", "p50 95% CI", "max ms"):
            table.add_column(name, justify="right" if name in ("n", "p50 ms", "max ms") else "left", no_wrap=True)
        for r in runs:
            commit = (r["git_commit"] or "-")[:10] + ("+" if r["git_dirty"] else "")
            for i, s in enumerate(r["points"].get(span) or []):
                head = [escape(r["run_id"]) if i == 0 else ""] + ([escape(s["label"])] if swept else [])
                facts = [escape(str(r["status"])), escape(" ".join(r.get("tags") or [])), (r["started"] or "-")[:16],
                         commit] if i == 0 else ["", "", "", ""]  # fmt: skip
                table.add_row(*head, *facts, str(s["n"]), _ms(s["p50_ms"]), _ci(s), _ms(s["max_ms"]))
            if r["points"].get(span):
                table.rows[-1].end_section = swept
        console.print(table)
    pooled = Table(
        title=f"pooled: every sample of the {len(runs)} runs, sweep point by sweep point", title_justify="left"
    )
    for name in ("span", "sweep point", "runs", "n", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms", "max ms"):
        pooled.add_column(name, justify="left" if name in ("span", "sweep point", "p50 95% CI") else "right")
    for span, rows in result["groups"].items():
        for i, s in enumerate(rows):
            p99 = _ms(s["p99_ms"]) if s["p99_reliable"] else "n<100"
            pooled.add_row(
                escape(span) if i == 0 else "", escape(s["label"]), str(len(s["runs"])), str(s["n"]), _ms(s["p50_ms"]),
                _ci(s), _ms(s["p90_ms"]), p99, _ms(s["max_ms"]), end_section=i == len(rows) - 1,
            )  # fmt: skip
    console.print(pooled)
    console.print(
        "Pooling treats the runs as one sample: read the medians run by run first, and pool runs that differ only "
        "by chance (the same playbook, inventory and code). Sweep points and playbooks are never pooled together.",
        style="dim",
    )
    pngs = []
    out = _out_dir(args)
    if not args.no_plots:
        for span in result["spans"]:
            path = _figures_to(
                out, lambda span=span: plot_cdf_overlay(runs, span, out / f"across_cdf_{_safe(span)}.png")
            )
            if path:
                pngs.append(path)
        _print_paths(console, pngs)
    if args.html is not None:
        from testbed.results.html_across import write_across_report

        target = _html_target(args.html, out, "across.html")
        _print_paths(console, [write_across_report([r["path"] for r in runs], target, pngs=pngs)])
    return EXIT_OK


# --- spans ---------------------------------------------------------------------------------------------------


def cmd_spans(args, console: Console) -> int:
    from testbed.catalog.query import span_counts

    counts = span_counts(_dirs(args), **selection_filters(args, mine_by_default=True))
    if args.json:
        print(json.dumps(counts, indent=2))
        return EXIT_OK
    if not counts:
        raise UserError("the selected runs measured no span; `testbed runs` with the same options lists them")
    table = Table(title=f"{len(counts)} spans the selected runs measured", title_justify="left")
    table.add_column("span", overflow="fold")
    table.add_column("runs", justify="right")
    table.add_column("samples", justify="right")
    for span, c in counts.items():
        table.add_row(escape(span), str(c["runs"]), str(c["samples"]))
    _wide(console).print(table)
    return EXIT_OK


# --- trend ---------------------------------------------------------------------------------------------------


def cmd_trend(args, console: Console) -> int:
    from testbed.catalog.across import trend
    from testbed.catalog.figures import plot_trend
    from testbed.catalog.points import parse_sweep

    console = _wide(console)
    dirs = _dirs(args)
    rows = trend(
        args.span, dirs, by=args.by, sweep=parse_sweep(args.sweep), **selection_filters(args, mine_by_default=True)
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    what = {"date": "run", "commit": "commit", "tag": "tag"}.get(args.by) or args.by.partition(":")[2].strip()
    series = list(dict.fromkeys(r["series"] for r in rows))
    swept = series != ["-"]
    table = Table(
        title=f"{args.span}: median and its 95% CI, {what} by {what}"
        + (f", one series per sweep point ({len(series)})" if swept else ""),
        title_justify="left",
    )
    columns = ["#", *(["sweep point"] if swept else []), what, "status", "started (UTC)", "runs", "n", "p50 ms"]
    for name in [*columns, "p50 95% CI"]:
        table.add_column(name, justify="right" if name in ("#", "runs", "n", "p50 ms") else "left")
    for i, r in enumerate(rows, 1):
        statuses = sorted(set(map(str, r["statuses"])))
        status = ", ".join(f"[red]{x}[/]" if x != "ok" else x for x in statuses)
        last = i == len(rows) or rows[i]["series"] != r["series"]
        table.add_row(
            str(i), *([escape(r["series"])] if swept else []), escape(r["label"]), status, r["started"] or "-",
            str(len(r["runs"])), str(r["n"]), _ms(r["p50_ms"]), _ci(r), end_section=swept and last,
        )  # fmt: skip
    console.print(table)
    if args.by in ("date", "commit"):
        _print_steps(console, rows, swept)
    marked = sum(1 for r in rows if any(x != "ok" for x in r["statuses"]))
    if marked:
        console.print(f"{marked} row(s) hold a run that did not end ok: its numbers are of the trials it ran")
    if args.by != "date" and args.by != "commit" and swept:
        labels = list(dict.fromkeys(r["label"] for r in rows))
        console.print(
            f"the figure: a line per {what} ({len(labels)}: {', '.join(labels)}) over the {len(series)} sweep points",
            markup=False,
        )
    out = _out_dir(args)
    path = _figures_to(
        out, lambda: plot_trend(rows, args.span, args.by, out / f"trend_{_safe(args.span)}_by_{_safe(args.by)}.png")
    )
    _print_paths(console, [path])
    return EXIT_OK


def _print_steps(console: Console, rows: list[dict], swept: bool) -> None:
    """Each step trend found in a series' history, between which runs (or commits) it happened."""
    from testbed.catalog.changes import DEFAULT_TOLERANCE_PCT, METHOD

    stepped = [r for r in rows if r["step"]]
    for r in stepped:
        low, high = r["step"]["interval"]
        where = f" {r['series']}:" if swept else ""
        console.print(
            f"step:{where} x{r['step']['ratio']:.3f} (95% interval {low:.3f}-{high:.3f}) between "
            f"{r['step']['after']} and {r['label']}",
            markup=False,
            soft_wrap=True,
        )
    if not stepped:
        console.print(f"no step beyond {DEFAULT_TOLERANCE_PCT:g} % in the history", style="dim")
    console.print(f"steps: {METHOD} beyond {DEFAULT_TOLERANCE_PCT:g} % (docs/catalog.md)", style="dim")


# --- gate ----------------------------------------------------------------------------------------------------


def cmd_gate(args, console: Console) -> int:
    from testbed.serve.webhook import Webhook

    errors = Console(stderr=True, highlight=False)
    webhook = (
        Webhook(args.webhook, lambda line: errors.print(line, markup=False, soft_wrap=True)) if args.webhook else None
    )
    try:
        return _gate(args, console, webhook)
    finally:
        if webhook is not None and webhook.close():  # the verdict is printed while the call is made
            errors.print(
                f"webhook {webhook.shown}: the call was not finished: its receiver did not answer", markup=False
            )


def _gate(args, console: Console, webhook) -> int:
    from testbed.catalog.gate import SLOWER, UNSURE, gate, owned, parse_selection
    from testbed.catalog.points import parse_sweep

    console = _wide(console)
    if not args.baseline and not args.against_trend:
        raise UserError("give the runs to compare with, --baseline KEY=VALUE (e.g. tag=before), or --against-trend")
    baseline = owned(parse_selection(args.baseline, "--baseline") if args.baseline else {})
    candidate = owned(parse_selection(args.candidate, "--candidate"))
    result = gate(
        args.spans, baseline, candidate, _dirs(args), max_slowdown_pct=args.max_slowdown,
        sweep=parse_sweep(args.sweep), against_trend=args.against_trend,
    )  # fmt: skip
    code = EXIT_EXPERIMENT_FAILED if result["failed"] else EXIT_OK
    if result["failed"] and webhook is not None:
        from testbed.serve.webhook import gate_failed

        webhook.post("gate FAIL", gate_failed(args, result))
    if args.json:
        print(json.dumps(result, indent=2))
        return code
    limit = result["limit"]
    comparisons = result["comparisons"]
    swept = any(c["label"] != "-" for c in comparisons)
    table = Table(
        title=f"candidate / baseline: the ratio of the pooled medians and its 95% interval, "
        f"{'sweep point by sweep point' if swept else 'span by span'}; a comparison fails when its "
        f"{result['correction']} adjusted p-value (of 'no slower than {limit:.3f} x') is <= {result['alpha']:g}, "
        f"over the {len(comparisons)} comparisons",
        title_justify="left",
    )
    table.add_column("span", overflow="fold")
    if swept:
        table.add_column("sweep point", overflow="fold")
    table.add_column("side", no_wrap=True)
    for name in ("runs", "n", "median ms"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("ratio [95%]", justify="right", no_wrap=True)
    table.add_column("p (Holm)", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    warnings = []
    for c in comparisons:
        span, interval = c["span"], c["interval"]
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.4f}"
        if interval is not None:
            ratio += f" [{interval[0]:.4f}-{interval[1]:.4f}]"
        style = {SLOWER: "red", UNSURE: "yellow"}.get(c["verdict"], "green")
        where = f"{span} @ {c['label']}" if swept else span
        for side in ("baseline", "candidate"):
            last = side == "candidate"
            row = [escape(span) if not last else ""]
            if swept:
                row.append(escape(c["label"]) if not last else "")
            row += [
                side, str(len(c[side + "_runs"])), str(c[side + "_n"]), _ms(c[side + "_median"]),
                ratio if last else "", f"{c['p_holm']:.4f}" if last else "",
                f"[{style}]{c['verdict']}[/]" if last else "",
            ]  # fmt: skip
            table.add_row(*row, end_section=last)
            if c["unit"][side] == "samples":
                warnings.append(
                    f"{where}: the {side} has {len(c[side + '_runs'])} run(s), fewer than 3: resampled by samples, "
                    "which leaves the run-to-run spread out of the interval; run more for a fair verdict"
                )
        if c["verdict"] == UNSURE:
            warnings.append(f"{where}: the interval spans the limit {limit:.3f}: these runs cannot tell; run more")
    console.print(table)
    if args.against_trend:
        for c in comparisons:
            since = c["baseline_since"]
            where = f"{c['span']} @ {c['label']}" if swept else c["span"]
            said = f"{since['steps']} step(s) in its history; " if since["steps"] else "no step in its history; "
            console.print(f"{where}: {said}the baseline is its runs since {since['run']}", markup=False, soft_wrap=True)
    if len(result["playbooks"]) > 1:
        console.print(
            f"the selections mix playbooks ({', '.join(result['playbooks'])}): compared playbook by playbook",
            markup=False,
        )
    errors = Console(stderr=True, highlight=False)
    for u in result["unmatched"]:
        point = " ".join(f"{k}={v}" for k, v in u["point"].items()) or "-"
        warnings.append(f"{u['span']} @ {u['playbook']} {point}: measured by the {u['side']} only; not compared")
    for warning in warnings:
        errors.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    if result["failed"]:
        slower = [c for c in comparisons if c["verdict"] == SLOWER]
        said = "; ".join(
            f"{c['span']}{' @ ' + c['label'] if swept else ''} x{c['ratio']:.3f} "
            f"(95% interval {c['interval'][0]:.3f}-{c['interval'][1]:.3f}, Holm p {c['p_holm']:.4f})"
            for c in slower
        )
        console.print(
            f"[red]gate: FAIL[/]: {len(slower)} of {len(comparisons)} comparisons slower than {limit:.3f} x the "
            f"baseline beyond noise: {escape(said)}",
            soft_wrap=True,
        )
    else:
        console.print(
            f"[green]gate: pass[/]: none of {len(comparisons)} comparisons "
            f"({'span x sweep point' if swept else 'spans'}) slower than {limit:.3f} x the baseline beyond noise"
        )
    return code
