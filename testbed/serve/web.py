"""The server's web page, read-only: the runs under way with their progress, the queue, the runs done, who holds
which device until when (the lab's leases); kept live by the server-sent events of GET /events and GET
/leases/events (no reload). Served on a TCP address of its own (`testbed serve --web
127.0.0.1:8080`) where a browser reaches it; that listener answers only what anyone may read (the page, GET /runs,
GET /events, the leases, the OpenAPI document): with no kernel to say who a TCP client is, nothing there changes a run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from testbed.contracts.errors import UserError
from testbed.serve.api import OPENAPI, Service, list_runs, stream_events
from testbed.serve.keys import SERVICE_KEY
from testbed.serve.leases_view import LEASE_PATHS, LEASES_KEY, LeaseWatch, list_leases, stream_leases

RECENT_RUNS = 200  # the newest runs of the catalog the page lists (testbed runs lists them all)
MAX_REPORT_BYTES = 64 << 20  # a report.html with its figures embedded is a few MB


def make_web_app(service: Service) -> web.Application:
    from testbed.leases import lease_store

    app = web.Application()
    app[SERVICE_KEY] = service
    # The store `testbed lease list` reads on this machine: the server's own Ray is private, so its runs on a lab
    # lease from this machine's lease folder too.
    app[LEASES_KEY] = LeaseWatch(lease_store())
    app.on_cleanup.append(_stop_watching)
    app.router.add_get("/", _page)
    app.router.add_get("/runs", list_runs)
    app.router.add_get("/events", stream_events)
    app.router.add_get("/catalog", _catalog)
    app.router.add_get("/report/{folder}", _report)
    app.router.add_get("/leases", list_leases)
    app.router.add_get("/leases/events", stream_leases)
    app.router.add_get("/openapi.json", _openapi)
    return app


async def _stop_watching(app: web.Application) -> None:
    await app[LEASES_KEY].stop()


async def _catalog(request: web.Request) -> web.Response:
    """GET /catalog: the newest runs of the server's results folder, from its catalog, newest first."""
    results = Path(request.app[SERVICE_KEY].info["results"])
    runs = await asyncio.get_running_loop().run_in_executor(None, recent_runs, results, RECENT_RUNS)
    return web.json_response({"runs": runs})


def recent_runs(results: Path, limit: int) -> list[dict]:
    """The newest `limit` runs the catalog of `results` holds (brought up to the folders first), newest first, each
    with whether it has an HTML report (`testbed report RUN --html`) the page links to.
    """
    from testbed.catalog import select_runs

    if not results.is_dir():
        return []
    rows = []
    for run in reversed(select_runs(results)[-limit:]):
        rows.append(
            {
                "folder": run["folder"],
                "playbook": run["playbook"],
                "status": run["status"],
                "target": run["target"],
                "started": run["started"],
                "duration_s": run["duration_s"],
                "trials_ok": run["trials_ok"],
                "trials_planned": run["trials_planned"],
                "tags": run["tags"],
                "user": run["user"],
                "report": (results / run["folder"] / "report.html").is_file(),
            }
        )
    return rows


async def _report(request: web.Request) -> web.Response:
    """GET /report/FOLDER: that run's report.html, read as a run folder's files are (no link followed), served in
    a sandbox (its own origin: nothing in it can act as the page).
    """
    from testbed.events.safe_files import read_bytes

    folder = request.match_info["folder"]
    if "/" in folder or folder.startswith(".") or not folder:
        raise web.HTTPNotFound(text="no such run")
    path = Path(request.app[SERVICE_KEY].info["results"]) / folder / "report.html"
    try:
        html = await asyncio.get_running_loop().run_in_executor(None, read_bytes, path, MAX_REPORT_BYTES)
    except (OSError, UserError) as exc:  # none, or refused (a link, not a regular file, too large)
        raise web.HTTPNotFound(text=f"no report for {folder}: {exc}") from None
    headers = {"Content-Security-Policy": "sandbox allow-scripts", "Cache-Control": "no-store"}
    return web.Response(body=html, content_type="text/html", charset="utf-8", headers=headers)


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI | {"paths": OPENAPI["paths"] | LEASE_PATHS})


async def _page(request: web.Request) -> web.Response:
    info = request.app[SERVICE_KEY].info
    title = f"testbed serve: {info['inventory']}" + (" (twin)" if info["emulate"] else "")
    page = PAGE.replace("{{title}}", _escape(title))
    return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# One page, no framework: a table per state, rebuilt from the runs as the events tell them. Every text from the
# server goes in through textContent (never as HTML).
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{title}}</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.2em; } h2 { font-size: 1em; margin-top: 1.5em; }
  table { border-collapse: collapse; min-width: 40em; }
  th, td { text-align: left; padding: 0.2em 0.8em; border-bottom: 1px solid #ddd; }
  td.status-ok { color: #16691f; } td.status-failed, td.status-aborted { color: #a31515; }
  #connection { color: #777; font-size: 0.9em; }
</style>
</head>
<body>
<h1>{{title}}</h1>
<p id="connection">connecting...</p>
<h2>Running and queued</h2>
<table id="active"><thead><tr><th>id</th><th>user</th><th>playbook</th><th>status</th><th>position</th>
<th>progress</th></tr></thead><tbody></tbody></table>
<h2>Leases: who holds which device until when</h2>
<p id="lease-notes">reading the leases...</p>
<table id="leases"><thead><tr><th>device</th><th>identity</th><th>holder</th><th>kind</th><th>since</th>
<th>until</th><th>note</th></tr></thead><tbody></tbody></table>
<h2>Done</h2>
<table id="done"><thead><tr><th>id</th><th>user</th><th>playbook</th><th>status</th><th>ended</th>
<th>results</th><th>error</th></tr></thead><tbody></tbody></table>
<h2>Recent runs (the catalog)</h2>
<table id="catalog"><thead><tr><th>run</th><th>playbook</th><th>status</th><th>target</th><th>started</th>
<th>trials ok</th><th>tags</th><th>user</th><th>report</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const runs = new Map();      // id -> the run as the last event described it
const progress = new Map();  // id -> what its last progress event said

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
}

function base(path) { return path ? path.split("/").pop() : ""; }

function render() {
  const all = [...runs.values()];
  const active = all.filter(r => r.status === "running" || r.status === "queued")
    .sort((a, b) => (a.status === "running" ? 0 : a.position) - (b.status === "running" ? 0 : b.position));
  const done = all.filter(r => !(r.status === "running" || r.status === "queued"))
    .sort((a, b) => b.ended - a.ended);
  const body = document.querySelector("#active tbody");
  body.replaceChildren();
  for (const r of active) {
    const row = body.insertRow();
    row.dataset.run = r.id; row.dataset.status = r.status;
    cell(row, r.id); cell(row, r.user); cell(row, base(r.playbook)); cell(row, r.status, "status-" + r.status);
    cell(row, r.position);
    cell(row, progress.get(r.id) || "");
  }
  const ended = document.querySelector("#done tbody");
  ended.replaceChildren();
  for (const r of done) {
    const row = ended.insertRow();
    row.dataset.run = r.id; row.dataset.status = r.status;
    cell(row, r.id); cell(row, r.user); cell(row, base(r.playbook)); cell(row, r.status, "status-" + r.status);
    cell(row, r.ended ? new Date(r.ended * 1000).toLocaleTimeString() : "");
    cell(row, base(r.run_dir)); cell(row, r.error);
  }
}

// Many events at once (the server's log, read when the page opens) are drawn once a frame, not once each.
let drawing = false;
function scheduleRender() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => { drawing = false; render(); });
}

// The catalog's newest runs: read when the page opens and after a run ends (it is indexed by then); one read at a
// time, and one more after it if a run ended meanwhile.
let cataloguing = false, catalogAgain = false;
function readCatalog() {
  if (cataloguing) { catalogAgain = true; return; }
  cataloguing = true;
  fetch("catalog").then(r => r.json()).then(answer => {
    const body = document.querySelector("#catalog tbody");
    body.replaceChildren();
    for (const r of answer.runs) {
      const row = body.insertRow();
      row.dataset.run = r.folder; row.dataset.status = r.status;
      cell(row, r.folder); cell(row, r.playbook); cell(row, r.status, "status-" + r.status); cell(row, r.target);
      cell(row, r.started); cell(row, r.trials_ok + "/" + r.trials_planned); cell(row, r.tags.join(", "));
      cell(row, r.user);
      const link = row.insertCell();
      if (r.report) {
        const a = document.createElement("a");
        a.href = "report/" + encodeURIComponent(r.folder); a.textContent = "report";
        link.appendChild(a);
      }
    }
  }).finally(() => {
    cataloguing = false;
    if (catalogAgain) { catalogAgain = false; readCatalog(); }
  });
}
readCatalog();

function said(data) {
  if (data.type === "fail") return "fail " + data.device + ": " + data.op;
  const trials = "trials " + data.trials_done + "/" + (data.trials == null ? "?" : data.trials);
  const last = data.last_measure && data.last_measure.ms != null
    ? ", last " + data.last_measure.span + " " + data.last_measure.ms.toFixed(2) + " ms" : "";
  return trials + " (" + data.op + last + ")";
}

// A run's event says where that run is; the others' places in the queue move with it: read them all again. What
// the page shows never goes back: an answer or an event older than the newest applied (by the server's event
// numbers) is left out.
let applied = 0;
let reading = false, again = false;  // one read at a time, and one more after it if an event came meanwhile
function readRuns() {
  if (reading) { again = true; return; }
  reading = true;
  fetch("runs").then(r => r.json()).then(answer => {
    if (answer.seq < applied) return;
    applied = answer.seq;
    runs.clear();
    for (const r of answer.runs) runs.set(r.id, r);
    render();
  }).finally(() => {
    reading = false;
    if (again) { again = false; readRuns(); }
  });
}

const events = new EventSource("events?since=0");
for (const type of ["run.queued", "run.started", "run.progress", "run.moved", "run.ended"]) {
  events.addEventListener(type, message => {
    const event = JSON.parse(message.data);
    if (type === "run.progress") progress.set(event.run.id, said(event.data));
    else readRuns();
    if (type === "run.ended") readCatalog();
    if (event.seq > applied) {
      applied = event.seq;
      runs.set(event.run.id, event.run);
    }
    scheduleRender();
  });
}

// The lab's leases (the store `testbed lease list` reads): the server reads it while the page listens and tells
// every change, a lease's lapse by its time included; each state replaces the one before.
function when(t) { return new Date(t * 1000).toLocaleString(); }
function showLeases(state) {
  const body = document.querySelector("#leases tbody");
  body.replaceChildren();
  for (const l of state.leases) {
    const row = body.insertRow();
    row.dataset.lease = l.id; row.dataset.kind = l.kind;
    cell(row, l.device); cell(row, l.identity); cell(row, l.holder + " pid " + l.pid);
    cell(row, l.kind === "run" ? "run " + l.run : "reservation"); cell(row, when(l.since)); cell(row, when(l.until));
    cell(row, l.note);
  }
  const notes = [state.error ? "cannot read the leases: " + state.error
                             : (state.leases.length ? "" : "no leases; ") + "from " + state.where];
  for (const d of state.damaged) notes.push(d.path + " " + d.why + ": its device is refused until it is gone");
  document.getElementById("lease-notes").textContent = notes.join("; ");
}
const leaseEvents = new EventSource("leases/events");
leaseEvents.addEventListener("leases", message => showLeases(JSON.parse(message.data)));

events.onopen = () => { document.getElementById("connection").textContent = "live"; };
events.onerror = () => { document.getElementById("connection").textContent = "reconnecting..."; };
</script>
</body>
</html>
"""
