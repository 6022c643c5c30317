"""The server's read-only web page in a real headless browser (Debian's chromium), as a person keeps it open: runs
appear, progress and end on the page without a reload. The page is driven over the DevTools protocol (a websocket,
aiohttp's client): the test waits inside the page, on its DOM, for what a person would see.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from accounts import ALICE, BOB, as_account, needs_root
from peers import require_program
from serve_processes import DevTools, DidNotListen, start_chromium
from served import BLOCKER, Served, waiting

from testbed.serve.client import Client

WAIT_S = 120  # bound on waiting for the page to show something (a slow CI machine), not a timing claim

# The page's rows as a person reads them: which table, which run, its status, and each cell's text.
ROWS = """() => [...document.querySelectorAll("tbody tr")].map(r => ({
  table: r.closest("table").id, run: r.dataset.run, status: r.dataset.status,
  cells: [...r.cells].map(c => c.textContent)}))"""


class Page:
    """One tab of a headless chromium, opened on `url` and read through the DevTools protocol."""

    def __init__(self, url: str, profile: Path) -> None:
        browser = require_program("chromium", "the web page is checked in a real browser (apt-get install chromium)")
        try:
            self.proc, self.browser_ws = start_chromium(browser, profile)
        except DidNotListen as ended:
            pytest.fail(str(ended))
        self.loop = asyncio.new_event_loop()
        self.session = self.loop.run_until_complete(self._open(url))

    async def _open(self, url: str):
        self.http = aiohttp.ClientSession()
        self.devtools = DevTools(await self.http.ws_connect(self.browser_ws, max_msg_size=0))
        self.events = self.devtools.events
        _, session = await self.devtools.open_tab()
        await self._call("Page.enable", {}, session)
        await self._call("Page.navigate", {"url": url}, session)
        await self._event("Page.loadEventFired")  # the page's own script has run: evaluating now meets it
        return session

    async def _call(self, method: str, params: dict, session: str | None = None) -> dict:
        return await self.devtools.call(method, params, session)

    async def _event(self, method: str) -> dict:
        while True:
            seen = next((e for e in self.events if e.get("method") == method), None)
            if seen is not None:
                return seen
            self.events.append(await asyncio.wait_for(self.devtools.ws.receive_json(), WAIT_S))

    def rows_when(self, condition: str, rows: str = ROWS) -> list[dict]:
        """The page's rows (as `rows`, a JavaScript function, reads them), once `condition` (a JavaScript function of
        the rows) holds: checked in the page at each change of its DOM, so the test waits on what the page shows,
        not on a clock.
        """
        expression = f"""new Promise(resolve => {{
          const rows = {rows}, holds = {condition};
          const check = () => {{ const now = rows(); if (holds(now)) resolve(JSON.stringify(now)); }};
          new MutationObserver(check).observe(document.documentElement,
            {{subtree: true, childList: true, characterData: true, attributes: true}});
          check();
        }})"""
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        call = self._call("Runtime.evaluate", params, self.session)
        result = self.loop.run_until_complete(asyncio.wait_for(call, WAIT_S))
        assert "exceptionDetails" not in result, result
        return json.loads(result["result"]["value"])

    def close(self) -> None:
        self.loop.run_until_complete(self.http.close())
        self.loop.close()
        self.proc.kill()
        self.proc.wait()


def _submit(socket: Path, name: str) -> dict:
    return Client(socket).submit({"playbook": BLOCKER, "playbook_file": name, "emulate": True})


@needs_root
def test_the_web_page_shows_two_users_runs_appear_progress_and_end_without_a_reload(repo, tmp_path, serve_dir):
    server = Served(repo, tmp_path / "results", serve_dir.parent / "web", web=True)
    page = None
    try:
        first = as_account(ALICE, _submit, server.socket, "blocker.yaml")  # two accounts' runs, one after the other
        server.events_until(waiting(first["id"]))
        second = as_account(BOB, _submit, server.socket, "blocker.yaml")
        page = Page(server.web_url, tmp_path / "chromium-profile")

        rows = page.rows_when(
            f"""rows => rows.some(r => r.run === "{first["id"]}" && r.status === "running"
                                  && r.cells[5].includes("wait"))
                     && rows.some(r => r.run === "{second["id"]}" && r.status === "queued" && r.cells[4] === "1")"""
        )
        running = next(r for r in rows if r["run"] == first["id"])
        assert running["table"] == "active" and running["cells"][:3] == [first["id"], str(ALICE), "blocker.yaml"]
        queued = next(r for r in rows if r["run"] == second["id"])
        assert queued["table"] == "active" and queued["cells"][:3] == [second["id"], str(BOB), "blocker.yaml"]

        server.client.cancel(first["id"])  # the page, open all along, shows it end and the next one start
        rows = page.rows_when(
            f"""rows => rows.some(r => r.run === "{first["id"]}" && r.table === "done")
                     && rows.some(r => r.run === "{second["id"]}" && r.status === "running")"""
        )
        ended = next(r for r in rows if r["run"] == first["id"])
        assert ended["status"] == "aborted" and ended["cells"][-1] == "cancelled by root"
        assert ended["cells"][5].endswith("_blocker")  # its results folder
        folder = ended["cells"][5]  # and the catalog's recent runs, read again as it ended, list it
        rows = page.rows_when(
            f"""rows => rows.some(r => r.table === "catalog" && r.run === "{folder}" && r.status !== "running")"""
        )
        listed = next(r for r in rows if r["table"] == "catalog" and r["run"] == folder)
        assert listed["cells"][1:4] == ["blocker", "aborted", "twin"]

        server.client.cancel(second["id"])
        rows = page.rows_when(f"""rows => rows.some(r => r.run === "{second["id"]}" && r.table === "done")""")
        assert not [r for r in rows if r["table"] == "active"]
    finally:
        if page is not None:
            page.close()
        assert server.stop() and server.proc.returncode == 0
