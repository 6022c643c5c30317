"""`testbed runs`: the runs of one or more results folders, from their catalog (docs/catalog.md); `runs tag`,
`runs untag` and `runs note` annotate one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from testbed.contracts.errors import EXIT_OK, UserError


def add_parser(sub) -> None:
    p = sub.add_parser("runs", help="list the runs of the results folders (filters, --json); tag or note one")
    add_selection_options(p)
    p.add_argument("--json", action="store_true", help="print the runs as JSON (a list of objects)")
    p.add_argument("--reindex", action="store_true", help="rebuild the catalog from the run folders first")
    p.add_argument(
        "--standalone", action="store_true", help="the runs of ./results even when testbed serve runs (docs/serve.md)"
    )
    action = p.add_subparsers(dest="action", metavar="ACTION")
    q = action.add_parser("tag", help="tag a run: testbed runs tag RUN NAME (kept in the run's folder)")
    q.add_argument("run", metavar="RUN", help="a run id (or its unique start) or a run folder")
    q.add_argument("name", metavar="NAME")
    _results_option(q, "action_results")
    q = action.add_parser("untag", help="take a tag off a run: testbed runs untag RUN NAME")
    q.add_argument("run", metavar="RUN", help="a run id (or its unique start) or a run folder")
    q.add_argument("name", metavar="NAME")
    _results_option(q, "action_results")
    q = action.add_parser("note", help="add a note to a run: testbed runs note RUN TEXT (kept in the run's folder)")
    q.add_argument("run", metavar="RUN", help="a run id (or its unique start) or a run folder")
    q.add_argument("text", metavar="TEXT", nargs="+")
    _results_option(q, "action_results")


def add_selection_options(p: argparse.ArgumentParser) -> None:
    """--results and the filters that select runs: what `testbed runs` takes, and every command over a selection."""
    _results_option(p)
    p.add_argument("--playbook", help="only runs of this playbook (its name)")
    p.add_argument("--inventory", help="only runs on this inventory (its name)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--lab", dest="target", action="store_const", const="lab", help="only runs on a lab")
    where.add_argument("--twin", dest="target", action="store_const", const="twin", help="only runs on the twin")
    p.add_argument("--status", help="only runs that ended so: ok, failed, aborted (running: its runner died)")
    p.add_argument("--since", help="only runs started on or after: YYYY-MM-DD (UTC day) or an ISO datetime")
    p.add_argument("--until", help="only runs started before the end of: YYYY-MM-DD (UTC day) or an ISO datetime")
    p.add_argument("--commit", help="only runs of this git commit (its first characters)")
    p.add_argument("--tag", action="append", help="only runs with this tag (repeat: all of them)")
    p.add_argument("--protocol", help="only runs with a switch of this driver or served interface (e.g. netconf)")
    p.add_argument(
        "--param", action="append", metavar="KEY=VALUE", help="only runs given this parameter (testbed run --param)"
    )
    p.add_argument(
        "--owner",
        action="append",
        metavar="WHO",
        help="only run folders this account owns (repeat; @GROUP: its members; anyone: every owner). gate, trend and "
        "report --across: yours unless given",
    )


def run_folder(run: str, results: list[str] | None = None, any_folder: bool = True) -> Path:
    """The folder a command's RUN argument names: a folder as given (`any_folder`: even one that is not a run, for
    the command to judge), else a run id or a unique start of one in the results folders (`results`, default
    ./results), said on stderr. Every command that takes a run resolves it here; UserError (exit 2) listing the
    candidates when the id is unknown or names several runs.
    """
    from testbed.catalog import resolve_run
    from testbed.catalog.query import results_paths

    path = Path(run)
    if any_folder and path.is_dir():
        return path
    found = resolve_run(run, results_paths(results or None))
    if found != path:
        Console(stderr=True, highlight=False).print(f"run {run}: {found}", markup=False, soft_wrap=True)
    return found


def add_run_options(p: argparse.ArgumentParser, *dests: str) -> None:
    """A command's RUN arguments (a run folder, or a run id or its unique start) and --results to look ids up in."""
    for dest in dests:
        p.add_argument(dest, metavar=dest.upper(), help="a run folder, or a run id (or its unique start)")
    _results_option(p)


def selection_filters(args, mine_by_default: bool = False) -> dict:
    """The filters of `add_selection_options` as select_runs' keyword arguments. `mine_by_default`: without --owner,
    only the invoking user's run folders (what gives a verdict over runs; testbed.catalog.owners).
    """
    from testbed.catalog.annotations import parse_params
    from testbed.catalog.owners import mine, resolve_owners

    names = ("playbook", "inventory", "target", "status", "since", "until", "commit", "tag", "protocol")
    owner = resolve_owners(args.owner) if args.owner else (mine() if mine_by_default else None)
    return {name: getattr(args, name) for name in names} | {"param": parse_params(args.param) or None, "owner": owner}


def _results_option(p: argparse.ArgumentParser, dest: str = "results") -> None:
    # An ACTION's own --results has a dest of its own: argparse would let its default replace the one given before
    p.add_argument(
        "--results",
        dest=dest,
        action="append",
        metavar="DIR",
        help="a results folder (repeat for several; default ./results, where testbed run writes)",
    )


def cmd_runs(args, console: Console) -> int:
    from testbed.catalog import add_note, add_tag, index_run, reindex, select_runs, sync
    from testbed.catalog.annotations import remove_tag
    from testbed.catalog.query import results_paths

    given = (args.results or []) + (getattr(args, "action_results", None) or [])
    dirs = results_paths(given or None)
    errors = Console(stderr=True, highlight=False)
    if args.action in ("tag", "untag", "note"):
        run_dir = run_folder(args.run, [str(d) for d in dirs], any_folder=False)
        try:
            if args.action == "tag":
                add_tag(run_dir, args.name)
                done = f"tagged {run_dir.name}: {args.name}"
            elif args.action == "untag":
                remove_tag(run_dir, args.name)
                done = f"untagged {run_dir.name}: {args.name}"
            else:
                add_note(run_dir, " ".join(args.text))
                done = f"noted on {run_dir.name}"
        except OSError as exc:
            raise UserError(
                f"{run_dir}: cannot write there ({exc.strerror or exc}): a run's tags and notes are kept in its "
                "folder, and this one is read-only"
            ) from None
        index_run(run_dir)
        console.print(done, markup=False, soft_wrap=True)
        return EXIT_OK
    if not given and not args.standalone:  # a server's results folder and its queue, when one answers
        served = _served_runs(args, errors)
        if served is not None:
            return _print_runs(args, console, served)
    for results in dirs:
        if not results.is_dir():
            continue  # select_runs says so
        report = reindex(results) if args.reindex else sync(results)
        if args.reindex:
            errors.print(f"{results}: {len(report.indexed)} runs indexed", markup=False, soft_wrap=True)
        for folder, why in report.skipped:  # not runs, or damaged: said, never fatal
            errors.print(f"[yellow]skipped[/] {escape(str(results / folder))}: {escape(why)}", soft_wrap=True)
    runs = select_runs(dirs, **selection_filters(args), sync_first=False)
    return _print_runs(args, console, runs)


def _print_runs(args, console: Console, runs: list[dict]) -> int:
    if args.json:
        print(json.dumps(runs, indent=2, default=str))
        return EXIT_OK
    if not console.is_terminal:  # a CI log, a file: a row per line, every column (tags included)
        console = Console(highlight=False, width=200, file=console.file)
    console.print(_table(runs, console.width))
    return EXIT_OK


def _served_runs(args, errors: Console) -> list[dict] | None:
    """The runs of every server answering on this host (testbed serve): those of its results folder's catalog that
    the filters select, then its running and queued runs not yet there (without a filter but --status and --owner,
    which they pass as the catalog's runs do), each with `queue` (id, user, position, socket). Where it lists them
    is said on stderr; None when no server answers (then ./results, as without one).
    """
    from testbed.catalog.annotations import parse_params
    from testbed.catalog.owners import resolve_owners
    from testbed.serve.client import Client, find_servers

    sockets = find_servers()
    if not sockets:
        errors.print("standalone: no testbed serve answers; the runs of ./results", markup=False, soft_wrap=True)
        return None
    parse_params(args.param)  # a mistake in one is said here, as without a server
    owners = resolve_owners(args.owner) if args.owner else None
    names = ("playbook", "inventory", "target", "status", "since", "until", "commit", "protocol")
    filters: dict = {name: getattr(args, name) for name in names}
    filters |= {"tag": args.tag, "param": args.param, "owner": [str(uid) for uid in owners] if owners else None}
    queue_shown = not any(filters[n] for n in names if n != "status") and not args.tag and not args.param
    runs: list[dict] = []
    listed: set[str] = set()  # results folders already listed (a lab's server and its twin's may share one)
    for socket_path in sockets:
        client = Client(socket_path)
        answer = client.catalog_runs(filters, reindex=args.reindex)
        said = f"via testbed serve at {socket_path}: the runs of {answer['results']}"
        errors.print(said, markup=False, soft_wrap=True)
        if args.reindex:
            errors.print(f"{answer['results']}: {answer['indexed']} runs indexed", markup=False, soft_wrap=True)
        for folder, why in answer["skipped"]:
            errors.print(f"[yellow]skipped[/] {escape(folder)}: {escape(why)}", soft_wrap=True)
        if answer["results"] not in listed:
            listed.add(answer["results"])
            runs += answer["runs"]
        if queue_shown:
            in_catalog = {r["folder"] for r in runs}
            info = client.info()
            for run in client.runs():
                folder = Path(run["run_dir"]).name if run["run_dir"] else None
                if run["status"] not in ("queued", "running") or folder in in_catalog:
                    continue
                if (args.status and args.status != run["status"]) or (owners and run["uid"] not in owners):
                    continue
                runs.append(_queue_row(run, info, socket_path))
    return runs


def _queue_row(run: dict, info: dict, socket_path: Path) -> dict:
    """A run of a server's queue as a row of `testbed runs`: what it has before the catalog has it."""
    return {
        "run_id": None,
        "folder": None,
        "status": run["status"],
        "owner": run["user"],
        "playbook": Path(run["playbook"]).name,
        "target": "twin" if info["emulate"] else "lab",
        "inventory": Path(info["inventory"]).name,
        "trials_planned": run["trials"],
        "tags": run["tags"],
        "queue": {k: run[k] for k in ("id", "user", "position", "submitted")} | {"socket": str(socket_path)},
    }


# The columns of `testbed runs`, in order; the optional ones are shown in this order of importance while the
# terminal has room (the run id, what the other commands take, is always whole).
COLUMNS = ("run", "status", "owner", "inventory", "on", "switches", "trials", "s", "commit", "tags")
OPTIONAL = ("tags", "owner", "inventory", "s", "switches")


def _cells(r: dict) -> dict[str, str]:
    """One run's cells, as text (escaped for rich)."""
    if r.get("queue") is not None:
        return _queue_cells(r)
    style = {"ok": "green", "failed": "red", "aborted": "yellow"}.get(r["status"] or "", "")
    status = escape(str(r["status"]))
    digest = f"@{r['inventory_digest'][:6]}" if r.get("inventory_digest") else ""  # two inventories of one name
    return {
        "run": escape(r["folder"]),
        "status": f"[{style}]{status}[/]" if style else status,
        "inventory": escape(str(r["inventory"]) + digest),
        "owner": escape(str(r.get("owner") or "-")),  # the folder's owner, as the kernel says
        "on": r["target"],
        "switches": escape(", ".join(f"{s['name']} ({s['driver']})" for s in r["switches"]) or "-"),
        "trials": f"{r['trials_ok']}/{r['trials_planned']}",
        "s": "-" if r["duration_s"] is None else f"{r['duration_s']:.1f}",
        "commit": escape((r["git_commit"] or "-")[:8] + ("+" if r["git_dirty"] else "")),
        "tags": escape(" ".join([*r["tags"], *(f"{k}={v}" for k, v in r.get("params", {}).items())])),
    }


def _queue_cells(r: dict) -> dict[str, str]:
    """A queued (or just started) run of a server: its queue id, what `testbed queue cancel` takes, for its run."""
    queue = r["queue"]
    where = f" (queue {queue['position']})" if queue["position"] else " (queue)"
    cells = dict.fromkeys(COLUMNS, "-") | {"tags": escape(" ".join(r["tags"])), "on": r["target"]}
    trials = "-" if r["trials_planned"] is None else f"0/{r['trials_planned']}"
    status = escape(r["status"])
    return cells | {"run": escape(queue["id"] + where), "status": status, "owner": escape(r["owner"]), "trials": trials}


def _table(runs: list[dict], width: int) -> Table:
    rows = [_cells(r) for r in runs]

    def needs(name: str) -> int:  # the column's width with its padding and rule, unwrapped
        return max([len(name), *(len(Text.from_markup(row[name])) for row in rows)]) + 3

    shown = [c for c in COLUMNS if c not in OPTIONAL]
    used = sum(needs(c) for c in shown) + 1
    for name in OPTIONAL:
        if used + needs(name) <= width:
            shown.append(name)
            used += needs(name)
    columns = [c for c in COLUMNS if c in shown]
    queued = sum(1 for r in runs if r.get("queue") is not None)
    title = f"{len(runs) - queued} runs" + (f", {queued} in the server's queue" if queued else "")
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, no_wrap=True, justify="right" if name in ("trials", "s") else "left")
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table
