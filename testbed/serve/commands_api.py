"""The routes `testbed plan`, `runs`, `report` and `lease list` use when a server answers (docs/serve.md): a plan made
against the server's Lab, the runs of its results folder, a run's report written by the server's account, and the
leases the server holds. Each is answered for the account the kernel says connected (api._peer), as every route of
the socket is; none acts in another's name: the server writes only into its own results folder, and takes no lease
for anyone.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from testbed.contracts.errors import UserError
from testbed.serve.identity import Peer
from testbed.serve.keys import IDENTIFY_KEY, SERVICE_KEY

# The selection filters of `testbed runs` GET /catalog/runs takes, with one value each; `tag`, `param` and `owner`
# may be repeated.
ONE_VALUE_FILTERS = ("playbook", "inventory", "target", "status", "since", "until", "commit", "protocol")
MANY_VALUE_FILTERS = ("tag", "param", "owner")
# matplotlib's figures are drawn one request at a time: two at once in one process would share its state
_DRAWING = threading.Lock()
HOST = socket.gethostname()  # a lease's holder names its host so (testbed.leases.me)


def add_command_routes(app: web.Application, identify: Callable[[web.Request], Peer]) -> None:
    """The routes, on the API's app; `identify`: who a request comes from, as the API tells it (api._peer)."""
    app[IDENTIFY_KEY] = identify
    app.router.add_post("/plan", _plan)
    app.router.add_get("/catalog/runs", _catalog_runs)
    app.router.add_get("/results/{run}", _result)
    app.router.add_post("/results/{run}/report", _write_report)
    app.router.add_get("/leases", _leases)


def _peer(request: web.Request) -> Peer:
    return request.app[IDENTIFY_KEY](request)


def _service(request: web.Request):  # api.Service: not imported, as api imports this module
    return request.app[SERVICE_KEY]


async def _body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise UserError("the body must be a JSON object")
    return body


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{key}: give true or false")
    return value


async def _in_thread(fn, *args):
    """Reading a catalog, planning and drawing take CPU or disk: off the event loop, so others are answered."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def _plan(request: web.Request) -> web.Response:
    """POST /plan: the server plans the playbook against its Lab (its inventory, its mode, the checks a submitted
    run gets) and says what it planned; the client draws the same plan, made from the same text and inventory, with
    `testbed plan`'s renderer, and checks that it is this one (a server that loaded other code may plan otherwise).
    """
    peer, service, body = _peer(request), _service(request), await _body(request)
    # The plan is made as a submitted run's is (its refusals included); `yes`: a plan writes nothing to confirm.
    request_body = {k: v for k, v in body.items() if k != "path"} | {"yes": True}

    def plan() -> dict:
        made = service.prepare(peer, request_body)[3]
        return {
            "inventory": service.info["inventory"],
            "emulate": service.info["emulate"],
            "playbook": made.playbook.name,
            "seed": made.seed,
            "trials": len(made.trials),
            "devices": list(made.devices),
            "writes": sorted(made.writes),
        }

    return web.json_response(await _in_thread(plan))


async def _catalog_runs(request: web.Request) -> web.Response:
    """GET /catalog/runs: the runs of the server's results folder its catalog holds (brought up to the folders first,
    as `testbed runs` does), filtered as `testbed runs` filters, oldest first; the folders it skipped, with why.
    """
    _peer(request)
    results = Path(_service(request).info["results"])
    query = request.query
    unknown = sorted(set(query) - {*ONE_VALUE_FILTERS, *MANY_VALUE_FILTERS, "reindex"})
    if unknown:
        raise UserError(f"unknown filter {', '.join(unknown)}: give {', '.join(ONE_VALUE_FILTERS)}")
    filters: dict[str, Any] = {name: query.get(name) for name in ONE_VALUE_FILTERS}
    filters["tag"] = query.getall("tag", []) or None
    filters["param"] = _params(query.getall("param", []))
    filters["owner"] = _owners(query.getall("owner", []))
    reindex = query.get("reindex") == "1"

    def select() -> dict:
        from testbed.catalog import reindex as rebuild
        from testbed.catalog import select_runs, sync

        if not results.is_dir():  # no run made yet
            return {"results": str(results), "runs": [], "skipped": [], "indexed": 0}
        report = rebuild(results) if reindex else sync(results)
        runs = select_runs(results, **filters, sync_first=False)
        skipped = [[str(results / folder), why] for folder, why in report.skipped]
        return {"results": str(results), "runs": runs, "skipped": skipped, "indexed": len(report.indexed)}

    return web.json_response(await _in_thread(select), dumps=_dumps)


def _params(values: list[str]) -> dict[str, str] | None:
    from testbed.catalog.annotations import parse_params

    return parse_params(values) or None  # UserError (a 400) for one that is not KEY=VALUE


def _owners(values: list[str]) -> list[int] | None:
    try:
        return [int(v) for v in values] or None
    except ValueError:
        raise UserError("owner: give uids (the client resolves names and groups)") from None


def _run_dir(request: web.Request) -> Path:
    """The folder in the server's results folder that the path's run names: a run id, a folder name, a unique start
    of one (UserError, a 400, listing the candidates when it names none or several).
    """
    from testbed.catalog import resolve_run

    run = request.match_info["run"]
    if not run or "/" in run or run.startswith("."):
        raise UserError(f"run {run!r}: give a run id (or its unique start) of the server's results folder")
    results = Path(_service(request).info["results"])
    found = resolve_run(run, [results])
    if found.parent.resolve() != results.resolve():
        raise UserError(f"run {run}: not a run of the server's results folder {results}")
    return found


async def _result(request: web.Request) -> web.Response:
    """GET /results/{run}: which folder of the server's results folder the run is."""
    _peer(request)
    run_dir = await _in_thread(_run_dir, request)
    return web.json_response({"run_dir": str(run_dir), "results": _service(request).info["results"]})


async def _write_report(request: web.Request) -> web.Response:
    """POST /results/{run}/report: the server's account draws the run's figures in its folder and, with `html`, its
    page (report.html), as `testbed report RUN [--html]` would: for a user who may read the folder, not write in it.
    """
    _peer(request)
    body = await _body(request)
    html, figures = _bool(body, "html", False), _bool(body, "figures", True)
    run_dir = await _in_thread(_run_dir, request)

    def write() -> dict:
        from testbed.events.safe_files import owner, writable_by_us

        if not writable_by_us(run_dir):  # a folder another account dropped into the results folder: not ours
            who = owner(run_dir) or "another account"
            raise UserError(f"{run_dir}: owned by {who}; the server writes only into its own run folders")
        from testbed.results.report import load_summary

        load_summary(run_dir)  # a folder that is no run (or damaged) says so before anything is drawn
        with _DRAWING:
            return _draw(run_dir, html=html, figures=figures)

    return web.json_response({"run_dir": str(run_dir)} | await _in_thread(write))


def _draw(run_dir: Path, *, html: bool, figures: bool) -> dict:
    from testbed.results.plots import write_plots

    drawn = [str(p) for p in write_plots(run_dir)] if figures else []
    page = None
    if html:
        from testbed.catalog.folder import run_labels
        from testbed.results.html_report import DEFAULT_FILE, render_run, write_text

        # None: every PNG of the folder, those just drawn among them, as `testbed report --html` embeds them
        page = str(write_text(run_dir / DEFAULT_FILE, render_run(run_dir, None, run_labels(run_dir))))
    return {"figures": drawn, "html": page}


async def _leases(request: web.Request) -> web.Response:
    """GET /leases: who the server is as a lease holder (its account, host and process), the leases of its store it
    holds, and the run under way (whose they are for): `testbed lease list` adds them to the store's view.
    """
    _peer(request)
    service = _service(request)

    def held() -> list[dict]:
        from testbed.leases import lease_store

        store = lease_store()  # the server's Lab runs on a private Ray: its leases are this machine's folder's
        mine = [lease for lease in store.list() if lease.holder.pid == os.getpid() and lease.holder.host == HOST]
        return [lease.to_json() for lease in mine]

    from testbed.serve.identity import user_name

    runs = service.queue.listing()[1]
    running = next((r for r in runs if r["status"] == "running"), None)
    queued = sum(1 for r in runs if r["status"] == "queued")
    holder = {"user": user_name(os.geteuid()), "host": HOST, "pid": os.getpid()}
    return web.json_response({"holder": holder, "leases": await _in_thread(held), "running": running, "queued": queued})


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)  # a catalog row's dates and paths as text


_RUN_PATH = [{"name": "run", "in": "path", "required": True, "schema": {"type": "string"}}]


def _refs(*codes: str) -> dict:
    error = {"$ref": "#/components/schemas/Error"}
    refused = {"description": "refused", "content": {"application/json": {"schema": error}}}
    return {code: refused for code in codes}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


OPENAPI_PATHS: dict[str, Any] = {
    "/plan": {
        "post": {
            "summary": "plan a playbook against the server's Lab (its inventory, its mode): what it planned",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "playbook": {"type": "string", "description": "the playbook's YAML text"},
                                "playbook_file": {"type": "string", "description": "its path, named in errors"},
                                "inventory_sha256": {"type": "string", "description": "refused if not the server's"},
                                "emulate": {"type": "boolean", "description": "refused if not the server's mode"},
                                "trials": {"type": "integer"},
                                "seed": {"type": "integer"},
                            },
                            "required": ["playbook"],
                        }
                    }
                },
            },
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "inventory": {"type": "string"},
                            "emulate": {"type": "boolean"},
                            "playbook": {"type": "string", "description": "its name"},
                            "seed": {"type": "integer"},
                            "trials": {"type": "integer"},
                            "devices": {"type": "array", "items": {"type": "string"}},
                            "writes": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "what was planned",
                ),
                **_refs("400"),
            },
        }
    },
    "/catalog/runs": {
        "get": {
            "summary": "the runs of the server's results folder, from its catalog, filtered as `testbed runs` filters",
            "parameters": [
                *({"name": n, "in": "query", "schema": {"type": "string"}} for n in ONE_VALUE_FILTERS),
                *(
                    {"name": n, "in": "query", "schema": {"type": "array", "items": {"type": "string"}}}
                    for n in MANY_VALUE_FILTERS
                ),
                {"name": "reindex", "in": "query", "schema": {"enum": ["0", "1"]}, "description": "rebuild first"},
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "results": {"type": "string", "description": "the server's results folder"},
                            "runs": {"type": "array", "items": {"type": "object"}},
                            "skipped": {"type": "array", "description": "[folder, why] not indexed"},
                            "indexed": {"type": "integer"},
                        },
                    },
                    "the runs, oldest first",
                ),
                **_refs("400"),
            },
        }
    },
    "/results/{run}": {
        "parameters": _RUN_PATH,
        "get": {
            "summary": "the folder of a run (its id or a unique start) in the server's results folder",
            "responses": {
                "200": _json({"type": "object", "properties": {"run_dir": {"type": "string"}}}, "its folder"),
                **_refs("400"),
            },
        },
    },
    "/results/{run}/report": {
        "parameters": _RUN_PATH,
        "post": {
            "summary": "the server's account draws the run's figures in its folder, and with html its report.html",
            "requestBody": {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {"html": {"type": "boolean"}, "figures": {"type": "boolean"}},
                        }
                    }
                }
            },
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "run_dir": {"type": "string"},
                            "figures": {"type": "array", "items": {"type": "string"}},
                            "html": {"type": ["string", "null"]},
                        },
                    },
                    "what was written",
                ),
                **_refs("400"),
            },
        },
    },
    "/leases": {
        "get": {
            "summary": "the leases the server holds, who it holds them as, and the run under way",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "holder": {"type": "object", "description": "user, host, pid"},
                            "leases": {"type": "array", "items": {"type": "object"}},
                            "running": {"oneOf": [{"$ref": "#/components/schemas/Run"}, {"type": "null"}]},
                            "queued": {"type": "integer"},
                        },
                    },
                    "the server's leases",
                )
            },
        }
    },
}
