"""The lab's leases as the web page shows them: who holds which device until when (docs/leases.md), read from the
store `testbed lease list` reads, and pushed to the open pages whenever that changes.

Nobody announces a lease's end (it lapses by its time) nor another process's take, so the store is read again and
again; but at a bounded rate whatever the number of pages: one reader for the server, every LEASE_READ_EVERY_S,
and only while a page listens (GET /leases/events). GET /leases answers from that reader's last read while it is
fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web

from testbed.contracts.errors import UserError

LEASE_READ_EVERY_S = 1.0  # how often the store is read while a page listens: a lease's end shows within a second


def read_leases(store) -> dict[str, Any]:
    """Every live lease of `store` (a testbed.leases.LeaseStore), one plain row each, by device; what the store
    could not believe (a damaged lease file refuses its device); or, for a store that cannot be read, why.
    """
    try:
        leases = store.list()
    except (OSError, UserError) as exc:  # an untrusted or unreachable lease folder: said on the page
        return {"where": store.where, "leases": [], "damaged": [], "error": str(exc)}
    rows = [
        {
            "id": lease.id,
            "device": lease.device,
            "identity": lease.identity,
            "holder": str(lease.holder),
            "pid": lease.holder.pid,
            "kind": lease.kind,
            "run": lease.holder.run,
            "since": lease.since,
            "until": lease.until,
            "note": lease.note,
        }
        for lease in sorted(leases, key=lambda lease: (lease.device, lease.since))
    ]
    damaged = [{"path": str(d.path), "why": d.why} for d in getattr(store, "damaged", [])]
    return {"where": store.where, "leases": rows, "damaged": damaged, "error": None}


class LeaseWatch:
    """The server's one reader of the lease store, in the web listener's event loop (reads run in its executor)."""

    def __init__(self, store) -> None:
        self.store = store
        self._last: dict[str, Any] | None = None
        self._read_at = -float("inf")  # time.monotonic() of the last read
        self._reading: asyncio.Lock | None = None  # made in the loop that uses it
        self._listeners: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None

    async def current(self) -> dict[str, Any]:
        """The leases as last read, read again if that is older than LEASE_READ_EVERY_S (one read at a time)."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if self._last is None or time.monotonic() - self._read_at >= LEASE_READ_EVERY_S:
                self._last = await asyncio.get_running_loop().run_in_executor(None, read_leases, self.store)
                self._read_at = time.monotonic()
            return self._last

    def listen(self) -> asyncio.Queue:
        """A queue given each new state of the leases (the first: as they are now) until `forget`."""
        listener: asyncio.Queue = asyncio.Queue()
        self._listeners.add(listener)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        return listener

    def forget(self, listener: asyncio.Queue) -> None:
        self._listeners.discard(listener)
        if not self._listeners and self._task is not None:
            self._task.cancel()  # nobody looks: the store is not read
            self._task = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        told: str | None = None
        fresh: set[asyncio.Queue] = set()
        while True:
            state = await self.current()
            said = json.dumps(state, sort_keys=True)
            for listener in list(self._listeners):
                if said != told or listener not in fresh:  # a new page is told the state once, the others changes
                    listener.put_nowait(state)
            fresh = set(self._listeners)
            told = said
            await asyncio.sleep(LEASE_READ_EVERY_S)


async def list_leases(request: web.Request) -> web.Response:
    """GET /leases: who holds which device until when (the store `testbed lease list` reads)."""
    return web.json_response(await request.app[LEASES_KEY].current())


async def stream_leases(request: web.Request) -> web.StreamResponse:
    """GET /leases/events, server-sent events: `leases` with every lease as they are now, then again at each change
    (a lease taken, released, or lapsed by its time).
    """
    watch: LeaseWatch = request.app[LEASES_KEY]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    listener = watch.listen()
    try:
        while True:
            state = await listener.get()
            await response.write(f"event: leases\ndata: {json.dumps(state)}\n\n".encode())
    except ConnectionResetError:  # the page was closed
        return response
    finally:
        watch.forget(listener)


LEASES_KEY: web.AppKey[LeaseWatch] = web.AppKey("leases")  # the web app's one reader of the lease store


# The web listener's OpenAPI document adds these to the API's paths (testbed.serve.web).

_LEASE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "device": {"type": "string", "description": "as the holder's inventory names it"},
        "identity": {"type": "string", "description": "the device itself (its address): what leases are keyed by"},
        "holder": {"type": "string", "description": "user@host"},
        "pid": {"type": "integer"},
        "kind": {"enum": ["reservation", "run"]},
        "run": {"type": ["string", "null"], "description": "the run holding it (kind run)"},
        "since": {"type": "number"},
        "until": {"type": "number", "description": "when it lapses by itself (seconds since the epoch)"},
        "note": {"type": "string"},
    },
}
_LEASES = {
    "type": "object",
    "properties": {
        "where": {"type": "string", "description": "the store read"},
        "leases": {"type": "array", "items": _LEASE},
        "damaged": {"type": "array", "items": {"type": "object"}, "description": "lease files not believed"},
        "error": {"type": ["string", "null"], "description": "why the store could not be read"},
    },
}
LEASE_PATHS = {
    "/leases": {
        "get": {
            "summary": "who holds which device until when (the store testbed lease list reads); the web listener",
            "responses": {"200": {"description": "the leases", "content": {"application/json": {"schema": _LEASES}}}},
        }
    },
    "/leases/events": {
        "get": {
            "summary": "server-sent events `leases`: the leases now, then at each change (taken, released, lapsed)",
            "responses": {"200": {"description": "a stream", "content": {"text/event-stream": {}}}},
        }
    },
}
