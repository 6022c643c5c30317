"""`testbed serve`, `testbed queue`, and `testbed run` through a running server (docs/serve.md)."""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.contracts.errors import EXIT_BAD_INPUT, EXIT_EXPERIMENT_FAILED, EXIT_OK, UserError

DEFAULT_INVENTORY = "playbooks/inventory/emulated-rack.yaml"


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="serve the lab: one warm session, a queue of every user's runs (docs/serve.md)")
    p.add_argument("--inventory", default=DEFAULT_INVENTORY, help=f"the lab's inventory (default {DEFAULT_INVENTORY})")
    p.add_argument("--emulate", action="store_true", help="serve the emulated twin of the inventory")
    p.add_argument(
        "--socket", help="the Unix socket to serve on (default: /run/testbed/NAME.sock as root; docs/serve.md)"
    )
    p.add_argument("--results", default="results", help="folder for run folders (default ./results)")
    p.add_argument("--admin-group", help="members of this group may cancel and move anyone's runs (root always may)")
    p.add_argument("--socket-group", help="only this group's members (and root) may connect (default: every account)")
    p.add_argument("--web", metavar="HOST:PORT", help="also serve the read-only web page there, e.g. 127.0.0.1:8080")
    p.add_argument("--remote", metavar="HOST:PORT", help="also serve the API over TLS there, to clients with a token")
    p.add_argument("--tls-cert", metavar="CERT", help="with --remote: the server's certificate (PEM, chain after)")
    p.add_argument("--tls-key", metavar="KEY", help="with --remote: the certificate's private key (PEM)")
    p.add_argument("--tokens", metavar="FILE", help="with --remote: users' token digests (testbed token new), mode 600")
    p.add_argument(
        "--webhook",
        metavar="URL",
        help="POST a JSON body to this http(s) URL when a run ends (id, user, status, results, figures; docs/serve.md)",
    )

    p = sub.add_parser("queue", help="the runs of testbed serve: list them, cancel one, move one in the queue")
    _server_options(p)
    action = p.add_subparsers(dest="action", metavar="ACTION")
    q = action.add_parser("cancel", help="cancel a queued run or stop the running one (yours; an admin: anyone's)")
    q.add_argument("run_id", metavar="ID")
    _server_options(q, suppress=True)
    q = action.add_parser("move", help="move a queued run to POSITION (1 is next)")
    q.add_argument("run_id", metavar="ID")
    q.add_argument("position", type=int, metavar="POSITION")
    _server_options(q, suppress=True)

    p = sub.add_parser("token", help="the tokens of testbed serve --remote: make a user's, remove one (docs/serve.md)")
    action = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = action.add_parser("new", help="a fresh token for USER (replacing theirs): printed once, its digest stored")
    q.add_argument("user", metavar="USER")
    q.add_argument("--tokens", required=True, metavar="FILE", help="the server's tokens file (made, mode 600)")
    q = action.add_parser("remove", help="remove USER's token: the server refuses it from the next request")
    q.add_argument("user", metavar="USER")
    q.add_argument("--tokens", required=True, metavar="FILE", help="the server's tokens file")


def _server_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    # On the actions too, so `testbed queue cancel ID --emulate` works; SUPPRESS keeps what was given before them.
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("--inventory", help=f"the lab's inventory (default {DEFAULT_INVENTORY})", **default)
    p.add_argument("--emulate", action="store_true", help="the server of the emulated twin", **default)
    p.add_argument("--socket", help="the server's socket (default: found from the inventory)", **default)
    add_remote_options(p, **default)


def add_remote_options(p: argparse.ArgumentParser, **default: Any) -> None:
    p.add_argument(
        "--server", metavar="URL", help="a lab's server over HTTPS: https://HOST:PORT ($TESTBED_SERVER)", **default
    )
    p.add_argument("--ca", metavar="FILE", help="with --server: the CA its certificate is verified with", **default)


def cmd_serve(args, console: Console) -> int:
    from testbed.serve.identity import default_socket
    from testbed.serve.server import ServeConfig, Server
    from testbed.serve.webhook import check_url

    if not Path(args.inventory).is_file():
        raise UserError(f"--inventory {args.inventory}: no such file")
    if args.admin_group is not None or args.socket_group is not None:
        _require_groups(args.admin_group, args.socket_group)
    remote = _remote(args, console)
    socket_path = Path(args.socket) if args.socket else default_socket(args.inventory, args.emulate)
    config = ServeConfig(
        str(Path(args.inventory).absolute()),
        args.emulate,
        socket_path.absolute(),
        Path(args.results).absolute(),
        admin_group=args.admin_group,
        socket_group=args.socket_group,
        web=_address(args.web) if args.web else None,
        remote=remote,
        webhook=check_url(args.webhook) if args.webhook else None,
    )
    return Server(config, console).serve()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--web {text}: give HOST:PORT, e.g. 127.0.0.1:8080 (port 0: any free port)")
    return host.strip("[]"), int(port)


def _remote(args, console: Console):
    """The remote listener of --remote, its certificate, key and tokens checked before anything starts; or None."""
    given = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tokens": args.tokens}
    if args.remote is None:
        stray = [name for name, value in given.items() if value is not None]
        if stray:
            raise UserError(f"{', '.join(stray)}: for the remote listener; give --remote HOST:PORT too")
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise UserError(f"--remote: give {', '.join(missing)} too (docs/serve.md: a lab's certificate, tokens)")
    from testbed.serve.remote import Remote, Tokens, parse_address, server_context

    def say(message: str) -> None:
        console.print(message, soft_wrap=True, markup=False, highlight=False)

    return Remote(
        parse_address(args.remote, "--remote"),
        server_context(Path(args.tls_cert), Path(args.tls_key)),
        Tokens(Path(args.tokens).absolute(), say=say),
    )


def cmd_token(args, console: Console) -> int:
    from testbed.serve.remote import new_token, remove_token

    path = Path(args.tokens)
    if args.action == "new":
        token = new_token(path, args.user)
        print(token)  # once, to this terminal alone: only its digest is kept
        Console(stderr=True).print(
            f"the token of {escape(args.user)}, shown this once; its digest is in {escape(str(path))}. The user keeps "
            "it in ~/.config/testbed/token (mode 600) or $TESTBED_TOKEN",
            soft_wrap=True,
        )
        return EXIT_OK
    remove_token(path, args.user)
    console.print(f"removed the token of {escape(args.user)} from {escape(str(path))}", soft_wrap=True)
    return EXIT_OK


def _require_groups(*groups: str | None) -> None:
    import grp

    for group in groups:
        if group is not None:
            try:
                grp.getgrnam(group)
            except KeyError:
                raise UserError(f"{group}: no such group on this machine") from None


def _server_url(args) -> str | None:
    """The remote server a command names (--server, else $TESTBED_SERVER), or None for the local one."""
    from testbed.serve.client import SERVER_ENV

    return getattr(args, "server", None) or os.environ.get(SERVER_ENV) or None


def _remote_client(args, url: str):
    from testbed.serve.client import RemoteClient, load_token

    RemoteClient.parse(url)  # a mistake in it is said before the token is looked for
    return RemoteClient(url, load_token(), getattr(args, "ca", None))


def _client(args):
    from testbed.serve.client import Client, find_server

    url = _server_url(args)
    if url is not None:
        return _remote_client(args, url)
    inventory = getattr(args, "inventory", None) or DEFAULT_INVENTORY
    emulate = getattr(args, "emulate", False)
    socket_path = getattr(args, "socket", None)
    if socket_path is None:
        found = find_server(inventory, emulate)
        if found is None:
            what = "its twin" if emulate else Path(inventory).name
            raise UserError(f"no testbed serve for {what} is running (testbed serve starts one; docs/serve.md)")
        socket_path = found
    return Client(socket_path)


def cmd_queue(args, console: Console) -> int:
    client = _client(args)
    if args.action == "cancel":
        answer = client.cancel(args.run_id)
        said = "cancelled" if answer["outcome"] == "cancelled" else "stopping (as on Ctrl-C: teardown, then its end)"
        console.print(f"{escape(answer['id'])}: {said}", soft_wrap=True)
        return EXIT_OK
    if args.action == "move":
        answer = client.move(args.run_id, args.position)
        console.print(f"{escape(answer['id'])}: now at position {answer['position']}", soft_wrap=True)
        return EXIT_OK
    runs = client.runs()
    table = Table(title=f"testbed serve at {escape(client.address)}", title_justify="left")
    for column in ("id", "user", "status", "position", "playbook", "submitted", "run"):
        table.add_column(column, overflow="fold")  # a narrow terminal wraps an id, never cuts it
    for run in runs:
        table.add_row(
            escape(run["id"]),
            escape(run["user"]),
            run["status"],
            str(run["position"] or ""),
            escape(Path(run["playbook"]).name),
            datetime.fromtimestamp(run["submitted"]).strftime("%H:%M:%S"),
            escape(Path(run["run_dir"]).name if run["run_dir"] else ""),
        )
    console.print(table)
    if not runs:
        console.print("no runs yet")
    return EXIT_OK


# -- testbed run through the server ----------------------------------------------------------------------------


def run_through_server(args, console: Console, inventory_file: str, confirm_writes: Callable[[], None]) -> int | None:
    """`testbed run` when a server answers for the inventory: submit, follow its events, print the same summary as a
    standalone run -> the exit code; None when no server answers (the run is then made here, as without one).
    """
    from testbed.catalog.annotations import parse_params
    from testbed.serve.client import Client, find_server

    url = _server_url(args)
    if url is not None:  # a server named outright: no standalone run in its place if it does not answer
        client = _remote_client(args, url)
    else:
        socket_path = find_server(inventory_file, args.emulate)
        if socket_path is None:  # said, so a user who expected the lab's server knows it was not used
            what = f"the twin of {Path(inventory_file).name}" if args.emulate else Path(inventory_file).name
            said = f"standalone: no testbed serve answers for {what}"
            console.print(said, soft_wrap=True, markup=False, highlight=False)
            return None
        client = Client(socket_path)
    if args.netns:
        raise UserError(f"--netns: testbed serve at {client.address} runs the twin as it was started; add --standalone")
    info = client.info()
    if args.results is not None and Path(args.results).absolute() != Path(info["results"]):
        raise UserError(
            f"--results {args.results}: runs through testbed serve at {client.address} go to its results folder, "
            f"{info['results']}; leave --results out, or add --standalone"
        )
    yes = args.yes
    if not args.emulate and not yes:
        confirm_writes()  # asks on the terminal, as a standalone run does, when the run writes to real devices
        yes = True
    try:
        text = Path(args.playbook).read_text(encoding="utf-8")
        # the server checks it is its inventory; a remote user may have no copy of it
        unchecked = url is not None and not Path(inventory_file).is_file()
        inventory_bytes = None if unchecked else Path(inventory_file).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {exc.filename or args.playbook}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{args.playbook}: not UTF-8 text ({exc})") from None
    console.print(f"via testbed serve at {client.address}", soft_wrap=True, markup=False, highlight=False)
    body = {
        "playbook": text,
        "playbook_file": str(Path(args.playbook).absolute()),
        "inventory_sha256": hashlib.sha256(inventory_bytes).hexdigest() if inventory_bytes is not None else None,
        "emulate": args.emulate,
        "trials": args.trials,
        "seed": args.seed,
        "yes": yes,
        # what --tag, --note and --param give the run (checked by cmd_run already): recorded with it by the server
        "tags": [t.strip() for t in args.tag or ()],
        "note": args.note,
        "params": parse_params(args.param),
    }
    queued = client.submit(body)
    where = f" at position {queued['position']}" if queued["position"] and queued["position"] > 1 else ""
    console.print(f"run {queued['id']} queued{where}", soft_wrap=True, markup=False, highlight=False)
    final = _follow(client, queued["id"], console)
    return _report(final, console)


def _follow(client, run_id: str, console: Console) -> dict:
    from testbed.serve.client import ServerError

    """Print the run's progress until it ends -> its last description. Ctrl-C cancels it (a queued run is dropped; the
    running one stops as a standalone run stops on Ctrl-C) and waits for its end; a second Ctrl-C leaves it.
    """
    final, seen = None, 0
    try:
        for event in client.events(run_id=run_id):
            final, seen = event["run"], event["seq"]
            _print_event(event, console)
    except KeyboardInterrupt:
        console.print(f"cancelling run {run_id} (Ctrl-C again to stop waiting for it)")
        client.cancel(run_id)
        for event in client.events(since=seen, run_id=run_id):
            final = event["run"]
            _print_event(event, console)
    if final is None or final["status"] in ("queued", "running"):
        try:
            final = client.run(run_id)
        except ServerError:
            raise
        except UserError:  # the stream ended with the server: it went away before the run ended
            raise UserError(_server_gone(client, run_id, final)) from None
    return final


def _server_gone(client, run_id: str, last: dict | None) -> str:
    """What a user is told when the server went away (killed, crashed) before their run ended."""
    gone = f"testbed serve at {client.address} went away before run {run_id} ended: "
    if last is not None and last["status"] == "running":
        heal = f"testbed heal {last['run_dir']}" if last.get("run_dir") else "nothing to heal (it had no folder yet)"
        return gone + f"it was under way and was cut off; {heal} restores what it left"
    return gone + "it was queued, and is kept: the next server for the lab makes it (testbed queue lists it)"


def _print_event(event: dict, console: Console) -> None:
    kind, run = event["type"], event["run"]
    if kind == "run.started":
        console.print(f"run {run['id']} started", markup=False, highlight=False)
    elif kind == "run.moved" and run["position"]:
        console.print(f"run {run['id']} moved to position {run['position']}", markup=False, highlight=False)
    elif kind == "run.progress":
        data = event.get("data", {})
        if data.get("type") == "fail":
            console.print(
                f"[red]fail[/] {escape(str(data.get('device')))}: {escape(str(data.get('op')))}: "
                f"{escape(str(data.get('error')).splitlines()[0] if data.get('error') else '')}",
                soft_wrap=True,
            )
        elif data.get("op") == "trial.end":
            last = data.get("last_measure")
            measured = f", last {last['span']} {last['ms']:.2f} ms" if last and last.get("ms") is not None else ""
            total = data.get("trials") or "?"
            said = f"trials {data['trials_done']}/{total} ({data.get('status') or 'ok'}{measured})"
            console.print(said, markup=False, highlight=False)


def _report(run: dict, console: Console) -> int:
    from testbed.results.report import load_summary, print_summary

    run_dir = Path(run["run_dir"]) if run.get("run_dir") else None
    if run_dir is not None:
        try:
            summary = load_summary(run_dir)
        except (UserError, OSError) as exc:  # the server's folder, which this account may not read
            console.print(f"[yellow]no table: {escape(str(exc))}[/]", soft_wrap=True)
        else:
            print_summary(console, summary, run_dir)
    if run.get("error"):
        Console(stderr=True).print(f"[red]{run['status']}:[/] {escape(run['error'])}", soft_wrap=True, markup=True)
    if run_dir is not None:
        console.print(f"results: {run_dir}", soft_wrap=True, markup=False, highlight=False)
    if run["status"] == "ok":
        return EXIT_OK
    return EXIT_BAD_INPUT if run["status"] == "refused" else EXIT_EXPERIMENT_FAILED


# -- testbed plan and report through the server -----------------------------------------------------------------


def plan_through_server(args, console: Console, inventory_file: str, make_plan: Callable[[], Any]) -> bool:
    """`testbed plan` when a server answers for the inventory (the lab's, else its twin's): the server plans it
    against its Lab (its inventory, its mode, the checks a run it is sent gets); the same plan, made here from the
    same text and inventory, is drawn as a standalone plan is -> True. False when none answers.
    """
    from testbed.cli.plan_view import print_plan
    from testbed.serve.client import Client, find_server

    socket_path = find_server(inventory_file, False) or find_server(inventory_file, True)
    if socket_path is None:
        what = Path(inventory_file).name
        console.print(f"standalone: no testbed serve answers for {what} (or its twin)", markup=False, highlight=False)
        return False
    text, inventory_bytes = _read_for_server(args.playbook, inventory_file)
    body = {
        "playbook": text,
        "playbook_file": str(Path(args.playbook).absolute()),
        "inventory_sha256": hashlib.sha256(inventory_bytes).hexdigest(),
        "trials": args.trials,
        "seed": args.seed,
    }
    planned = Client(socket_path).plan(body)
    plan = make_plan()
    mine = {"seed": plan.seed, "trials": len(plan.trials), "devices": list(plan.devices), "writes": sorted(plan.writes)}
    differs = [key for key, value in mine.items() if planned[key] != value]
    if differs:  # a server started before an update plans with the code it loaded then
        raise UserError(
            f"testbed serve at {socket_path} plans this playbook otherwise ({', '.join(differs)} differ): it may run "
            "older code (restart it), or pass --standalone"
        )
    console.print(f"via testbed serve at {socket_path}", soft_wrap=True, markup=False, highlight=False)
    print_plan(console, plan, inventory_file)
    return True


def _read_for_server(playbook: str, inventory_file: str) -> tuple[str, bytes]:
    """The playbook's text and the inventory's bytes, read with this account's rights (the server reads no file a
    client names).
    """
    try:
        return Path(playbook).read_text(encoding="utf-8"), Path(inventory_file).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {exc.filename or playbook}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{playbook}: not UTF-8 text ({exc})") from None


def served_run(run: str):
    """`testbed report RUN` with a server answering: (its client, the run's folder) when RUN is a run of a server's
    results folder (a run id or its unique start, or a folder of it), said on stderr; None otherwise (then RUN is
    looked up in ./results, as without a server). A run id no server and no ./results knows: the server's error.
    """
    from testbed.serve.client import Client, ServerError, find_servers

    errors = Console(stderr=True, highlight=False)
    refused: ServerError | None = None
    folder = Path(run)
    for socket_path in find_servers():
        client = Client(socket_path)
        if folder.is_dir():
            if folder.absolute().parent.resolve() == Path(client.info()["results"]).resolve():
                return client, folder
            continue
        try:
            found = Path(client.result(run)["run_dir"])
        except ServerError as exc:  # not a run of this server's results folder
            refused = refused or exc
            continue
        errors.print(f"run {run}: {found} (testbed serve at {socket_path})", markup=False, soft_wrap=True)
        return client, found
    if refused is not None and not folder.is_dir():
        from testbed.catalog import resolve_run

        try:
            resolve_run(run)  # a run of ./results, as without a server
        except UserError:
            raise refused from None
    return None
