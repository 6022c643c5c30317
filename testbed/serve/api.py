"""The server's HTTP API over its Unix socket (aiohttp), described by OPENAPI (served at /openapi.json).

Every request is answered for the account the kernel says connected (identity.peer_of), never one the request
names. Reading is for everyone who may connect; a run's cancel and move are for its owner and the lab's admins.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from testbed.contracts.errors import UserError
from testbed.serve.identity import Admins, Peer, peer_of
from testbed.serve.keys import SERVICE_KEY
from testbed.serve.queue import Closed, QueuedRun, RunQueue
from testbed.serve.webhook import WEBHOOKS

# What each kind of event means: docs/serve.md lists them too.
EVENT_TYPES = ("run.queued", "run.started", "run.progress", "run.moved", "run.ended")
# Where a listener that identifies its clients itself (testbed.serve.remote: by token) puts a request's Peer.
PEER_KEY = "testbed.peer"


@dataclass
class Service:
    """What the API works on: the queue, who the admins are, the server's own description, and the two acts the
    runner does (make a run's plan from a request; stop the run under way).
    """

    queue: RunQueue
    admins: Admins
    info: dict[str, Any]
    # (peer, request body) -> (playbook file, its text, options, plan)
    prepare: Callable[[Peer, dict], tuple[str, str, dict, Any]]
    stop_running: Callable[[QueuedRun, str], None]  # (the running run, who asked)


def make_app(service: Service, *, authenticate=None) -> web.Application:
    """`authenticate`: a middleware that sets each request's PEER_KEY (or refuses it), for a listener that is not the
    Unix socket.
    """
    app = web.Application(middlewares=([authenticate] if authenticate else []) + [_errors_as_json])
    app[SERVICE_KEY] = service
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_get("/info", _info)
    app.router.add_post("/runs", _submit)
    app.router.add_get("/runs", list_runs)
    app.router.add_get("/runs/{id}", _get)
    app.router.add_delete("/runs/{id}", _cancel)
    app.router.add_post("/queue/{id}/move", _move)
    app.router.add_get("/events", stream_events)
    from testbed.serve.commands_api import add_command_routes

    add_command_routes(app, _peer)  # for testbed plan, runs, report and lease list (docs/serve.md)
    return app


def _peer(request: web.Request) -> Peer:
    if PEER_KEY in request:
        return request[PEER_KEY]
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:  # only a Unix socket has a kernel-given account
        raise web.HTTPForbidden(text=_error("the connection's account is unknown"), content_type="application/json")
    return peer_of(sock)


def _error(message: str) -> str:
    return json.dumps({"error": message})


def _fail(status: type[web.HTTPException], message: str) -> web.HTTPException:
    return status(text=_error(message), content_type="application/json")


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    """A refused request is answered with {"error": why}; a UserError from preparing a run is a 400."""
    try:
        return await handler(request)
    except UserError as exc:
        raise _fail(web.HTTPBadRequest, str(exc)) from None


def _service(request: web.Request) -> Service:
    return request.app[SERVICE_KEY]


def _run(request: web.Request) -> QueuedRun:
    run = _service(request).queue.find(request.match_info["id"])
    if run is None:
        raise _fail(web.HTTPNotFound, f"no run {request.match_info['id']} on this server (testbed queue lists them)")
    return run


def _manageable(request: web.Request, run: QueuedRun, what: str) -> Peer:
    peer, service = _peer(request), _service(request)
    if not peer.may_manage(run.uid, service.admins):
        raise _fail(
            web.HTTPForbidden,
            f"run {run.id} is {run.user}'s: only {run.user} or the lab's admins ({service.admins}) may {what} it; "
            f"you are {peer.user}",
        )
    return peer


async def _body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _fail(web.HTTPBadRequest, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise _fail(web.HTTPBadRequest, "the body must be a JSON object")
    return body


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


async def _info(request: web.Request) -> web.Response:
    peer = _peer(request)
    service = _service(request)
    return web.json_response(service.info | {"you": peer.user, "admin": service.admins.includes(peer)})


async def _submit(request: web.Request) -> web.Response:
    peer, service, body = _peer(request), _service(request), await _body(request)
    # Loading and planning take a moment of CPU: off the event loop, so other clients are answered meanwhile.
    prepared = await asyncio.get_running_loop().run_in_executor(None, service.prepare, peer, body)
    playbook_file, text, options, plan = prepared
    try:
        run = service.queue.submit(peer.uid, peer.user, playbook_file, options, plan, text)
    except Closed:
        raise _fail(web.HTTPServiceUnavailable, "the server is stopping: it takes no more runs") from None
    return web.json_response(service.queue.describe(run), status=201)


async def list_runs(request: web.Request) -> web.Response:
    """GET /runs: for anyone who may connect (the web page's listener too). `seq`: the last event they reflect."""
    seq, runs = _service(request).queue.listing()
    return web.json_response({"runs": runs, "seq": seq})


async def _get(request: web.Request) -> web.Response:
    _peer(request)
    return web.json_response(_service(request).queue.describe(_run(request)))


async def _cancel(request: web.Request) -> web.Response:
    run = _run(request)
    peer = _manageable(request, run, "cancel")
    service = _service(request)
    outcome = service.queue.cancel(run, peer.user)
    if outcome == "stopping":
        service.stop_running(run, peer.user)
    elif outcome != "cancelled":
        raise _fail(web.HTTPConflict, f"run {run.id} has ended ({run.status}): nothing to cancel")
    return web.json_response(service.queue.describe(run) | {"outcome": outcome})


async def _move(request: web.Request) -> web.Response:
    run = _run(request)
    _manageable(request, run, "move")
    body = await _body(request)
    position = body.get("position")
    if not isinstance(position, int) or isinstance(position, bool) or position < 1:
        raise _fail(web.HTTPBadRequest, "position: give the place in the queue, 1 for next")
    try:
        _service(request).queue.move(run, position)
    except ValueError as exc:
        raise _fail(web.HTTPConflict, str(exc)) from None
    return web.json_response(_service(request).queue.describe(run))


async def stream_events(request: web.Request) -> web.StreamResponse:
    """GET /events, server-sent events: every event after `since` (0: all the server keeps), then each as it happens.
    With `run=ID`, that run's alone, and the stream ends after its run.ended. For anyone who may connect.
    """
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        raise _fail(web.HTTPBadRequest, "since: give an event number (0 for all)") from None
    only = request.query.get("run")
    queue = _service(request).queue
    if only is not None and queue.find(only) is None:
        raise _fail(web.HTTPNotFound, f"no run {only} on this server")
    loop = asyncio.get_running_loop()
    waiting: asyncio.Queue[dict] = asyncio.Queue()

    def listener(event: dict) -> None:  # called in whichever thread made the change
        try:
            loop.call_soon_threadsafe(waiting.put_nowait, event)
        except RuntimeError:
            pass  # the loop has closed: the server is going

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    backlog = queue.events_since(since, listener)
    try:
        for event in backlog:
            if await _send(response, event, only):
                return response
        while True:
            if await _send(response, await waiting.get(), only):
                return response
    except ConnectionResetError:  # the client went away (a Ctrl-C'd `testbed run`): nothing more to send it
        return response
    finally:
        queue.forget(listener)


async def _send(response: web.StreamResponse, event: dict, only: str | None) -> bool:
    """Write one event (if it is for the run asked about) -> whether the stream is done."""
    if only is not None and event["run"]["id"] != only:
        return False
    await response.write(f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    return only is not None and event["type"] == "run.ended"


_RUN = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "user": {"type": "string", "description": "the account that submitted it, as the kernel identified it"},
        "uid": {"type": "integer"},
        "playbook": {"type": "string"},
        "status": {"enum": ["queued", "running", "ok", "failed", "aborted", "cancelled", "refused"]},
        "position": {"type": ["integer", "null"], "description": "place in the queue, 1 is next; null if not queued"},
        "trials": {"type": ["integer", "null"]},
        "seed": {"type": ["integer", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "submitted": {"type": "number"},
        "started": {"type": ["number", "null"]},
        "ended": {"type": ["number", "null"]},
        "run_dir": {"type": ["string", "null"], "description": "the results folder of the run, once it has one"},
        "error": {"type": ["string", "null"]},
    },
}
_ERROR = {"description": "refused", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_ONE_RUN = {"description": "the run", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}}}
_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "testbed serve",
        "version": "1",
        "description": "A lab's run queue, over a Unix socket; each caller is the account the kernel says it is "
        "(docs/serve.md).",
    },
    "paths": {
        "/runs": {
            "post": {
                "summary": "submit a run (queued behind the others)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "playbook": {"type": "string", "description": "the playbook's YAML text"},
                                    "playbook_file": {"type": "string", "description": "its path, for the record"},
                                    "path": {
                                        "type": "string",
                                        "description": "instead of playbook: a file the server reads (only for "
                                        "root and the server's own account)",
                                    },
                                    "inventory_sha256": {
                                        "type": "string",
                                        "description": "the client's inventory file's hash: refused if not the "
                                        "server's",
                                    },
                                    "emulate": {"type": "boolean", "description": "refused if not the server's mode"},
                                    "trials": {"type": "integer"},
                                    "seed": {"type": "integer"},
                                    "tags": {"type": "array", "items": {"type": "string"}},
                                    "note": {"type": "string", "description": "kept with the run (testbed runs)"},
                                    "params": {
                                        "type": "object",
                                        "additionalProperties": {"type": "string"},
                                        "description": "parameters the playbook does not say, kept with the run",
                                    },
                                    "yes": {"type": "boolean", "description": "a real lab's writes are confirmed"},
                                },
                            }
                        }
                    },
                },
                "responses": {"201": _ONE_RUN, "400": _ERROR, "409": _ERROR, "503": _ERROR},
            },
            "get": {
                "summary": "every run: running, queued (in order), done",
                "responses": {
                    "200": {
                        "description": "the runs",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
                                        "seq": {"type": "integer", "description": "the last event they reflect"},
                                    },
                                }
                            }
                        },
                    }
                },
            },
        },
        "/runs/{id}": {
            "parameters": _ID,
            "get": {"summary": "one run", "responses": {"200": _ONE_RUN, "404": _ERROR}},
            "delete": {
                "summary": "cancel a queued run, or stop the running one (its owner, or an admin)",
                "responses": {"200": _ONE_RUN, "403": _ERROR, "404": _ERROR, "409": _ERROR},
            },
        },
        "/queue/{id}/move": {
            "parameters": _ID,
            "post": {
                "summary": "move a queued run to a place in the queue (its owner, or an admin)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"type": "object", "properties": {"position": {"type": "integer"}}}
                        }
                    },
                },
                "responses": {"200": _ONE_RUN, "400": _ERROR, "403": _ERROR, "404": _ERROR, "409": _ERROR},
            },
        },
        "/events": {
            "get": {
                "summary": "server-sent events: " + ", ".join(EVENT_TYPES),
                "parameters": [
                    {"name": "since", "in": "query", "schema": {"type": "integer"}, "description": "after this seq"},
                    {"name": "run", "in": "query", "schema": {"type": "string"}, "description": "one run's"},
                ],
                "responses": {"200": {"description": "a stream", "content": {"text/event-stream": {}}}},
            }
        },
        "/info": {"get": {"summary": "the server: inventory, mode, results folder; who you are", "responses": {}}},
        "/openapi.json": {"get": {"summary": "this document", "responses": {}}},
    },
    "webhooks": WEBHOOKS,  # what testbed serve --webhook URL POSTs
    "components": {
        "schemas": {
            "Run": _RUN,
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}},
        }
    },
}


def _described() -> None:
    from testbed.serve.commands_api import OPENAPI_PATHS

    OPENAPI["paths"].update(OPENAPI_PATHS)


_described()
