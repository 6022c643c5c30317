"""The `testbed` command. Its options and exit codes are a contract that scripts rely on:
0 success, 1 experiment failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape  # messages quote user text such as [rows, cols]: never markup

from testbed.contracts.errors import EXIT_BAD_INPUT, EXIT_EXPERIMENT_FAILED, EXIT_OK, UserError

if TYPE_CHECKING:  # the documents load when a command needs them
    from testbed.documents.inventory import Inventory

DEFAULT_INVENTORY = "playbooks/inventory/emulated-rack.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="testbed",
        description="Experiments on photonic ML-datacenter testbeds, on the lab or on its emulated twin.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check inventory and playbook files")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--inventory", help=f"inventory that playbooks refer to (default {DEFAULT_INVENTORY})")

    p = sub.add_parser("plan", help="print what `run` would do; touches no device")
    p.add_argument("playbook")
    _run_shape_options(p)
    p.add_argument(
        "--standalone", action="store_true", help="plan in this process even when testbed serve serves the lab"
    )

    p = sub.add_parser("run", help="run a playbook")
    p.add_argument("playbook")
    _run_shape_options(p)
    p.add_argument("--emulate", action="store_true", help="run against the emulated twin of the inventory")
    _netns_option(p)
    p.add_argument("--results", help="folder for run folders (default ./results)")
    _ray_address_option(p, "join this Ray cluster instead of starting a private local one")
    p.add_argument("--yes", action="store_true", help="do not ask before the first write to a real device")
    p.add_argument(
        "--wait", action="store_true", help="on a lab: wait for devices others hold (testbed lease list) to be free"
    )
    p.add_argument(
        "--standalone", action="store_true", help="run in this process even when testbed serve serves the lab"
    )
    from testbed.cli.serve import add_remote_options

    add_remote_options(p)  # --server, --ca: a lab's server over HTTPS (docs/serve.md)

    p.add_argument("--tag", action="append", help="tag the run (repeat for several): `--tag NAME` selects it later")
    p.add_argument("--note", help="a note on the run, kept with it (testbed runs, reports)")
    p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="a parameter of the run the playbook does not say (repeat): `--param KEY=VALUE` selects it later",
    )

    from testbed.cli.serve import add_parsers as add_serve_parsers

    add_serve_parsers(sub)  # serve, queue, token (docs/serve.md)

    p = sub.add_parser("emulate", help="run the emulated twin of an inventory until Ctrl-C")
    p.add_argument("inventory", nargs="?", default=DEFAULT_INVENTORY)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fault-proxy",
        action="store_true",
        help="a Toxiproxy-compatible proxy in front of every TCP endpoint; prints each device's fault_proxy: line",
    )
    _netns_option(p)

    p = sub.add_parser("lease", help="reserve a lab's devices, list who holds what, release (docs/leases.md)")
    lease = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = lease.add_parser("acquire", help="reserve devices for a time: testbed lease acquire ocs1 --for 2h")
    q.add_argument("targets", nargs="+", metavar="TARGET", help="device, range gpu[01:04], pattern gpu*, kind, all")
    q.add_argument("--for", dest="duration", required=True, help="how long: 2h, 90m, 1h30m, 45s")
    q.add_argument("--note", help="why, for the others (shown by testbed lease list)")
    q.add_argument("--wait", action="store_true", help="wait until the devices are free instead of refusing")
    q = lease.add_parser("list", help="every lease: device, holder user@host, since, until, note")
    q = lease.add_parser("release", help="release your reservations (on TARGETs, or all of them)")
    q.add_argument("targets", nargs="*", metavar="TARGET")
    q.add_argument("--id", nargs="+", help="release these leases (ids from testbed lease list)")
    q.add_argument("--force", action="store_true", help="with --id: release another user's lease too")
    for q in lease.choices.values():
        q.add_argument("--inventory", help="the lab's inventory (default: as for testbed run)")
        _ray_address_option(q, "the lab's Ray cluster, whose keeper holds the leases of every host")

    p = sub.add_parser("report", help="print the tables of a run and write its figures (PNG) next to the results")
    p.add_argument(
        "run_dir", nargs="?", help="a run folder, or a run id or its unique start (or --across and a selection)"
    )
    p.add_argument("--json", action="store_true", help="print summary.json (writes no figures)")
    p.add_argument("--no-plots", action="store_true", help="print the tables only")
    p.add_argument(
        "--html",
        nargs="?",
        const="",
        metavar="FILE",
        help="write the run as one self-contained HTML file to share (default RUN_DIR/report.html; docs/reports.md)",
    )
    p.add_argument(
        "--standalone", action="store_true", help="a run of ./results (or --results), even when testbed serve runs"
    )
    from testbed.cli.campaign import add_across_options
    from testbed.cli.campaign import add_parsers as add_campaign_parsers

    add_across_options(p)  # report --across SELECTION (docs/catalog.md)

    from testbed.cli.runs import add_parser as add_runs_parser
    from testbed.cli.runs import add_run_options

    p = sub.add_parser("compare", help="put two runs side by side, span by span (sweep point by sweep point)")
    add_run_options(p, "run_a", "run_b")

    add_runs_parser(sub)
    add_campaign_parsers(sub)  # spans, trend, gate

    from testbed.cli.export import add_parser as add_export_parser

    add_export_parser(sub)

    p = sub.add_parser("check", help="verify a run from its history (invokes closed, fabric, interlocks)")
    add_run_options(p, "run_dir")

    p = sub.add_parser(
        "heal", help="restore the lab after a run whose runner died (faults, jobs, fabric), from its event log"
    )
    add_run_options(p, "run_dir")
    p.add_argument("--inventory", help="the inventory the run used (default: the file run.json records)")

    p = sub.add_parser("replay", help="replay a run's audit log through fresh emulators and compare every reply")
    add_run_options(p, "run_dir")

    p = sub.add_parser("schema", help="write JSON Schemas of inventories and playbooks (for editors)")
    p.add_argument("--out", default=".", help="folder to write inventory.schema.json and playbook.schema.json")
    return parser


def _run_shape_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inventory", help=f"inventory file (default {DEFAULT_INVENTORY})")
    p.add_argument("--trials", type=int, help="override the playbook's number of trials")
    p.add_argument("--seed", type=int, help="override the playbook's seed")


def entry() -> None:
    """The `testbed` command (and `python -m testbed`): main, then out at once. By then every file is written and
    closed and every process the command started is stopped, and Python's own teardown of what a run loaded
    (Ray's and gRPC's native libraries among it) is a wait for nothing (docs/tuning.md).
    """
    code = main()
    logging.shutdown()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(highlight=False)
    errors = Console(stderr=True, highlight=False)
    try:
        return COMMANDS[args.command](args, console)
    except UserError as exc:
        errors.print(f"[red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output left (`testbed trend --json | head`): nothing more to say to it. stdout is pointed
    at /dev/null so that the interpreter's last flush does not raise again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OK


def cmd_validate(args, console: Console) -> int:
    from testbed.contracts.errors import ConfigError
    from testbed.documents import detect_kind, load_inventory, load_playbook

    problems: list[str] = []
    inventories: dict[str, Inventory] = {}  # each inventory loaded once, whatever number of playbooks use it
    for path in args.files:
        try:
            kind = detect_kind(path)
            if kind == "inventory":
                detail = load_inventory(path).summary()  # what its ranges and patterns expanded to
            else:
                file = args.inventory or default_inventory(path)
                if file not in inventories:
                    inventories[file] = load_inventory(file).model
                inventory = inventories[file]
                load_playbook(path, inventory)
                detail = f"playbook, against inventory {inventory.name}"
            console.print(f"[green]ok[/] {escape(path)} ({escape(detail)})")
        except ConfigError as exc:
            problems.extend(str(p) for p in exc.problems)
    if problems:
        for problem in problems:
            console.print(f"[red]error:[/] {escape(str(problem))}", soft_wrap=True)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _ray_address_option(parser: argparse.ArgumentParser, help: str) -> None:
    """--ray-address, defaulting to $RAY_ADDRESS as Ray's own tools do."""
    parser.add_argument(
        "--ray-address", default=os.environ.get("RAY_ADDRESS") or None, help=f"{help} (default: $RAY_ADDRESS)"
    )


def _netns_option(p) -> None:
    p.add_argument(
        "--netns",
        action="store_true",
        help="with the twin: every GPU host a network namespace of its own on a management network (docs/netns.md)",
    )


def default_inventory(playbook: str | None = None) -> str:
    """The inventory the playbook names (`inventory:`), else playbooks/inventory/emulated-rack.yaml from the
    working directory, else next to the playbook.
    """
    if playbook is not None:
        from testbed.documents import declared_inventory

        declared = declared_inventory(playbook)
        if declared is not None:
            return declared
    if Path(DEFAULT_INVENTORY).is_file() or playbook is None:
        return DEFAULT_INVENTORY
    beside = Path(playbook).parent / "inventory" / Path(DEFAULT_INVENTORY).name
    return str(beside) if beside.is_file() else DEFAULT_INVENTORY


def _load_plan(args):
    from testbed.documents import load_inventory, load_playbook
    from testbed.plan import make_plan

    inventory_file = args.inventory or default_inventory(args.playbook)
    inventory = load_inventory(inventory_file).model
    playbook = load_playbook(args.playbook, inventory).model
    return inventory_file, make_plan(playbook, inventory, trials=args.trials, seed=args.seed)


def cmd_plan(args, console: Console) -> int:
    from testbed.cli.plan_view import print_plan

    if not args.standalone:  # a server for the lab (testbed serve) plans against its own Lab, if one answers
        from testbed.cli.serve import plan_through_server

        inventory_file = args.inventory or default_inventory(args.playbook)
        if plan_through_server(args, console, inventory_file, lambda: _load_plan(args)[1]):
            return EXIT_OK
    inventory_file, plan = _load_plan(args)
    print_plan(console, plan, inventory_file)
    return EXIT_OK


def cmd_run(args, console: Console) -> int:
    metadata = _run_metadata(args)  # a mistake in it costs nothing: before a server or Ray is asked for anything
    if not args.standalone:  # a server for the lab (testbed serve) makes the run in its warm session, if one answers
        from testbed.cli.serve import run_through_server

        inventory_file = args.inventory or default_inventory(args.playbook)
        served = run_through_server(args, console, inventory_file, lambda: _confirm_writes(args))
        if served is not None:
            return served
    args.results = args.results or "results"
    from testbed.engine.ray_session import RayStart

    # Ray's start is the longest wait of a run: it begins first (a local instance in a process of its own) and
    # goes on while this process imports its modules and loads the files. A mistake in them is reported at once,
    # and the start is let go of: nothing touches a device before the files are loaded.
    if args.netns:  # before Ray starts: a mistake costs nothing
        if not args.emulate:
            raise UserError("--netns is a way to run the emulated twin: add --emulate")
        from testbed.twin.netns import refuse_without_privilege

        refuse_without_privilege()
    ray_start = RayStart(args.ray_address)
    try:
        from testbed.engine.run import RunOptions
        from testbed.lab import one_run_lab, refuse_on_a_lab, refuse_on_the_twin
        from testbed.results.report import print_summary

        inventory_file, plan = _load_plan(args)
        if args.emulate:
            refuse_on_the_twin(plan, args.playbook)
        else:
            refuse_on_a_lab(plan, inventory_file, confirmed=True)  # all but the writes, which are asked about next
            if plan.writes and not args.yes:
                _confirm(plan)
        options = RunOptions(
            args.playbook, inventory_file, args.results, args.emulate, args.ray_address, wait_for_leases=args.wait
        )
        lab = one_run_lab(plan, options, console, ray_start, netns=args.netns)
    except BaseException:
        ray_start.abandon()
        raise
    with lab:  # one run in a session of its own: `testbed run` is a thin user of testbed.Lab
        run = lab.run(plan, playbook_file=args.playbook, yes=True)
        # The table and the folder before Ray and the twin shut down: what the user waited for.
        print_summary(console, run.summary, run.run_dir)
        if run.error:
            Console(stderr=True).print(f"[red]{run.status}:[/] {escape(run.error)}", soft_wrap=True, markup=True)
        metadata(run.run_dir)
        console.print(f"results: {run.run_dir}", soft_wrap=True, markup=False, highlight=False)
    return EXIT_OK if run.status == "ok" else EXIT_EXPERIMENT_FAILED


def _confirm_writes(args) -> None:
    _, plan = _load_plan(args)
    if plan.writes:
        _confirm(plan)


def _run_metadata(args):
    """What --tag, --note and --param give a run, checked now; returns what records them in its folder (its
    annotations, which the catalog indexes) once the run has one.
    """
    from testbed.catalog.annotations import MAX_TAG, parse_params

    params = parse_params(args.param)
    tags = [t.strip() for t in args.tag or ()]
    for tag in tags:
        if not tag or len(tag) > MAX_TAG or any(c.isspace() for c in tag):
            raise UserError(f"--tag {tag!r}: a tag is one word of 1 to {MAX_TAG} characters (no spaces)")
    if args.note is not None and not args.note.strip():
        raise UserError("--note: an empty note; say what to remember about the run")

    def record(run_dir: Path) -> None:
        if not (tags or params or args.note):
            return
        from testbed.catalog import add_note, add_tag, index_run
        from testbed.catalog.annotations import add_param

        for tag in tags:
            add_tag(run_dir, tag)
        for name, value in params.items():
            add_param(run_dir, name, value)
        if args.note:
            add_note(run_dir, args.note)
        index_run(run_dir)

    return record


def _confirm(plan) -> None:
    targets = ", ".join(f"{d} ({a})" for d, a in plan.addresses().items() if d in plan.writes)
    if not sys.stdin.isatty():
        raise UserError(f"this run writes to real devices: {targets}; pass --yes to confirm (no terminal to ask)")
    answer = input(f"This run writes to real devices: {targets}. Continue? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UserError("not confirmed; nothing was written")


def cmd_lease(args, console: Console) -> int:
    from testbed.cli.leases import cmd_lease

    return cmd_lease(args, console)


def cmd_serve(args, console: Console) -> int:
    from testbed.cli.serve import cmd_serve

    return cmd_serve(args, console)


def cmd_queue(args, console: Console) -> int:
    from testbed.cli.serve import cmd_queue

    return cmd_queue(args, console)


def cmd_token(args, console: Console) -> int:
    from testbed.cli.serve import cmd_token

    return cmd_token(args, console)


def cmd_emulate(args, console: Console) -> int:
    from testbed.twin.standalone import serve_twin

    return serve_twin(args.inventory, args.seed, console, fault_proxy=args.fault_proxy, netns=args.netns)


def cmd_report(args, console: Console) -> int:
    from testbed.results.report import load_summary, print_summary

    if args.across or args.run_dir is None:
        from testbed.cli.campaign import cmd_report_across

        if not args.across:
            raise UserError("give a run folder, or --across and a selection of runs (testbed runs' filters)")
        return cmd_report_across(args, console)
    from testbed.cli.runs import run_folder

    served = None  # (client, its run folder) when the run is one of a server's results folder
    if not args.standalone and args.results is None:
        from testbed.cli.serve import served_run

        served = served_run(args.run_dir)
    run_dir = served[1] if served is not None else run_folder(args.run_dir, args.results)
    # Where this account may not write (the server's account owns the folder), the server draws what it writes.
    by_server = served[0] if served is not None and args.out is None and not _writable(run_dir) else None
    summary = load_summary(run_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    out = Path(args.out) if args.out else None
    if args.html is not None:
        import tempfile

        from testbed.events.safe_files import owner, writable_by_us
        from testbed.results.html_report import DEFAULT_FILE, render_run, write_text

        if not args.html and by_server is not None:
            answer = by_server.write_report(run_dir.name, html=True, figures=not args.no_plots)
            said = f"wrote {answer['html']} (by testbed serve at {by_server.socket_path})"
            console.print(said, soft_wrap=True, markup=False, highlight=False)
            return EXIT_OK
        if not args.html and not writable_by_us(run_dir):
            name = owner(run_dir)
            why = f"owned by {name}" if name else "not writable by you"
            raise UserError(f"{run_dir}: {why}: the report is not written into it; pass --html FILE")
        target = Path(args.html) if args.html else run_dir / DEFAULT_FILE
        if target.is_dir():  # --html DIR: the page goes in it
            target = target / DEFAULT_FILE
        with tempfile.TemporaryDirectory(prefix="testbed-report-") as scratch:
            pngs = None  # every PNG in the run folder
            if not args.no_plots:
                written, where = _run_figures(run_dir, out, Path(scratch))
                pngs = None if where == run_dir else written
            from testbed.catalog.folder import run_labels

            path = write_text(target, render_run(run_dir, pngs, run_labels(run_dir)))
        console.print(f"wrote {path}", soft_wrap=True, markup=False, highlight=False)
        return EXIT_OK
    _print_labels(console, run_dir)
    print_summary(console, summary, run_dir)
    from testbed.events.safe_files import owner

    folder_owner = owner(run_dir)
    if folder_owner is not None:  # another's folder: read, never written into (docs/run-folders.md)
        console.print(f"{run_dir}: owned by {folder_owner}", soft_wrap=True, markup=False, highlight=False)
    if not args.no_plots:
        if by_server is not None:
            drawn = [Path(p) for p in by_server.write_report(run_dir.name, html=False, figures=True)["figures"]]
        else:
            drawn = _run_figures(run_dir, out, None)[0]
        for path in drawn:
            console.print(f"wrote {path}", soft_wrap=True, markup=False, highlight=False)
    return EXIT_OK


def _writable(run_dir: Path) -> bool:
    from testbed.events.safe_files import writable_by_us

    return writable_by_us(run_dir)


def _print_labels(console: Console, run_dir: Path) -> None:
    """Before the report's tables (whose first line is the playbook, run, status and trials): the inventory by name
    and content digest (a copy with a slower switch under the same name is another), lab or twin, and the run's tags,
    params and notes.
    """
    from testbed.catalog.folder import run_labels

    labels = run_labels(run_dir)
    inventory = labels["inventory"] or "?"
    if labels["inventory_digest"]:
        inventory += f"@{labels['inventory_digest'][:6]}"
    if labels["inventory_file"]:
        inventory += f" ({labels['inventory_file']})"
    params = " ".join(f"{k}={v}" for k, v in (labels.get("params") or {}).items())
    parts = [f"inventory {inventory}", *([labels["target"]] if labels["target"] else [])]
    parts += [f"tags {' '.join(labels.get('tags') or []) or '-'}", f"params {params or '-'}"]
    console.print("  ".join(parts), markup=False, highlight=False, soft_wrap=True)
    for note in labels.get("notes") or []:
        console.print(f"note: {note['text']}", markup=False, highlight=False, soft_wrap=True)
    if "annotations_error" in labels:
        console.print(f"tags and notes not read: {labels['annotations_error']}", style="yellow", markup=False)


def _run_figures(run_dir: Path, out: Path | None, scratch: Path | None) -> tuple[list[Path], Path | None]:
    """Draw a run's figures where --out says, else in its folder; a folder they cannot be written in (a read-only
    archive) leaves them to `scratch` (the HTML page's, which embeds them) or, with none, unwritten with a warning.
    Returns the paths and the folder they went to.
    """
    from testbed.results.plots import write_plots

    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            return write_plots(run_dir, out), out
        except OSError as exc:
            raise UserError(f"--out {out}: cannot write the figures there ({exc.strerror or exc})") from None
    from testbed.events.safe_files import owner, writable_by_us

    try:
        if not writable_by_us(run_dir):  # another's folder, or read-only: nothing is written into it
            name = owner(run_dir)
            raise PermissionError(f"owned by {name}" if name else "not writable by you")
        return write_plots(run_dir), run_dir
    except OSError as exc:
        why = f"cannot write the figures in {run_dir} ({exc.strerror or exc})"
        errors = Console(stderr=True, highlight=False)
        if scratch is None:
            errors.print(f"[yellow]figures not written:[/] {escape(why)}; --out DIR writes them there", soft_wrap=True)
            return [], None
        errors.print(f"[yellow]note:[/] {escape(why)}: drawn for the page only", soft_wrap=True)
        return write_plots(run_dir, scratch), scratch


def cmd_compare(args, console: Console) -> int:
    from testbed.cli.runs import run_folder
    from testbed.results.compare import main as compare_main

    run_a, run_b = run_folder(args.run_a, args.results), run_folder(args.run_b, args.results)
    return compare_main(run_a, run_b)  # 0 compared, 2 a folder that is not a run


def cmd_runs(args, console: Console) -> int:
    from testbed.cli.runs import cmd_runs

    return cmd_runs(args, console)


def cmd_export(args, console: Console) -> int:
    from testbed.cli.export import cmd_export

    return cmd_export(args, console)


def cmd_spans(args, console: Console) -> int:
    from testbed.cli.campaign import cmd_spans

    return cmd_spans(args, console)


def cmd_trend(args, console: Console) -> int:
    from testbed.cli.campaign import cmd_trend

    return cmd_trend(args, console)


def cmd_gate(args, console: Console) -> int:
    from testbed.cli.campaign import cmd_gate

    return cmd_gate(args, console)  # 0 pass, 1 a span slower beyond noise, 2 bad input


def cmd_check(args, console: Console) -> int:
    from testbed.cli.runs import run_folder
    from testbed.ops.check import check_run

    result = check_run(run_folder(args.run_dir, args.results))
    for name, problems in result.checks.items():
        if problems:
            console.print(f"[red]FAIL[/] {name}")
            for problem in problems[:20]:
                console.print(f"     {problem}", soft_wrap=True, markup=False)
            if len(problems) > 20:
                console.print(f"     ... and {len(problems) - 20} more")
        else:
            console.print(f"[green]ok[/]   {name}")
    for note in result.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    return EXIT_OK if result.ok else EXIT_EXPERIMENT_FAILED


def cmd_heal(args, console: Console) -> int:
    from testbed.cli.runs import run_folder
    from testbed.ops.heal import heal_run

    # 0 healed (or nothing to heal), 1 not all healed, 2 bad input
    return heal_run(run_folder(args.run_dir, args.results), console, args.inventory)


def cmd_replay(args, console: Console) -> int:
    from testbed.cli.runs import run_folder
    from testbed.ops.audit_replay import main as replay_main

    return replay_main(str(run_folder(args.run_dir, args.results)))  # 0 all agree, 1 a disagreement, 2 not a run folder


def cmd_schema(args, console: Console) -> int:
    from testbed.documents.json_schema import write_schemas

    for path in write_schemas(Path(args.out)):
        console.print(f"wrote {path}")
    return EXIT_OK


COMMANDS = {
    "validate": cmd_validate,
    "plan": cmd_plan,
    "run": cmd_run,
    "serve": cmd_serve,
    "queue": cmd_queue,
    "token": cmd_token,
    "emulate": cmd_emulate,
    "lease": cmd_lease,
    "report": cmd_report,
    "compare": cmd_compare,
    "runs": cmd_runs,
    "spans": cmd_spans,
    "trend": cmd_trend,
    "gate": cmd_gate,
    "export": cmd_export,
    "check": cmd_check,
    "heal": cmd_heal,
    "replay": cmd_replay,
    "schema": cmd_schema,
}

if __name__ == "__main__":
    raise SystemExit(main())
