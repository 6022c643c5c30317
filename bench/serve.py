"""`testbed serve`: command to table through a running server against the standalone path and Ansible, cold; a
queued run's wait after the run before it ends; the web page's first paint with 1,000 runs in the catalog.

    python bench/serve.py [--hosts 64] [--rounds 5] [--queued 20] [--catalog 1000]

Figures, side by side in one run:
- command to table (the health check of --hosts emulated GPU hosts, `playbooks/gpu-health.yaml --trials 1`): from
  starting `testbed run` in a fresh process to the end of its first health step (its `health.wall` span's end, on
  the machine's monotonic clock): through a running `testbed serve --emulate` that made the same playbook once
  before the rounds (warm), against `testbed run --standalone` (its own Ray, twin and hubs), and against
  `ansible all -m raw` of the same commands over a twin's hosts, cold (a fresh ControlPath: OpenSSH connects and
  authenticates every host; the best of -f 5 and -f HOSTS), when ansible is installed. Rounds alternate the order.
- a queued run's wait: --queued+1 runs of the same playbook submitted at once to the warm server; for each run
  after the first, from the run before it ending (its `run.end` event) to its own first device command (its first
  event), and the server's hand-over alone (the queue's `run.ended` of the one -> `run.started` of the next).
- the web page: --catalog runs in the server's results folder (copies of one real run, indexed), the page opened
  in a fresh tab of a headless chromium: navigation -> first contentful paint, and -> the catalog's rows drawn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import REPO, compile_project, stats, write_out  # noqa: E402
from health_fanout import (  # noqa: E402
    RunFailed,
    _health_walls,
    ansible_binary,
    ansible_env,
    ansible_inventory,
    ansible_once,
    inventory_text,
    with_testbed,
)
from rich.console import Console  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "catalog"))
sys.path.insert(0, str(REPO / "tests" / "serve"))
from catalog_copies import copy_run  # noqa: E402
from serve_processes import DevTools, chromium, read_until_listening, start_chromium  # noqa: E402

from testbed.serve.identity import SERVE_DIR_ENV  # noqa: E402

HEALTH = str(REPO / "playbooks/gpu-health.yaml")


class Server:
    """A `testbed serve --emulate` for the bench: its process, socket folder and web page."""

    def __init__(self, inventory: Path, results: Path, serve_dir: Path) -> None:
        self.env = os.environ | {SERVE_DIR_ENV: str(serve_dir)}
        command = [sys.executable, "-m", "testbed", "serve", "--emulate", "--inventory", str(inventory)]
        command += ["--results", str(results), "--web", "127.0.0.1:0"]
        self.proc = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=subprocess.PIPE, text=True)
        listening = read_until_listening(self.proc)
        self.socket, self.web_url = listening.socket, listening.web_url
        from testbed.serve.client import Client

        self.client = Client(self.socket, timeout=600)

    def run_to_end(self, run_id: str, since: int = 0) -> list[dict]:
        seen = []
        for event in self.client.events(since=since, run_id=run_id, timeout=600):
            seen.append(event)
        return seen

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def served_cold(server: Server, inventory: Path) -> float:
    """Seconds from starting `testbed run` (a fresh process) to the end of its first health step, through the server."""
    command = [sys.executable, "-m", "testbed", "run", HEALTH, "--emulate", "--inventory", str(inventory)]
    command += ["--trials", "1"]
    start = time.monotonic_ns()
    proc = subprocess.run(command, cwd=REPO, env=server.env, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    if (
        proc.returncode != 0
        or not lines
        or not lines[0].startswith("via testbed serve")
        or "results: " not in lines[-1]
    ):
        raise RunFailed(
            f"testbed run through the server exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
        )
    run_dir = Path(lines[-1].removeprefix("results: "))
    return (_health_walls(run_dir / "events.jsonl")[0][1] - start) / 1e9


def queue_waits(server: Server, inventory: Path, queued: int) -> dict:
    """`queued`+1 runs submitted at once: each later run's wait after the one before it ended."""
    text = Path(HEALTH).read_text()
    body = {"playbook": text, "playbook_file": HEALTH, "emulate": True, "trials": 1}
    runs = [server.client.submit(body) for _ in range(queued + 1)]
    server.run_to_end(runs[-1]["id"])  # the last one's end: the others ended before it
    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    dirs: dict[str, str] = {}
    wanted = {r["id"] for r in runs}
    for event in server.client.events(since=0, timeout=600):  # the server's log: every run's start and end
        rid = event["run"]["id"]
        if rid in wanted and event["type"] == "run.started":
            started[rid] = event["time"]
        if rid in wanted and event["type"] == "run.ended":
            ended[rid], dirs[rid] = event["time"], event["run"]["run_dir"]
            if event["run"]["status"] != "ok":
                raise RunFailed(f"queued run {rid}: {event['run']['status']} {event['run']['error']}")
            if rid == runs[-1]["id"]:
                break
    waits, handovers, finishing, starting = [], [], [], []
    for before, after in zip(runs, runs[1:], strict=False):
        first_before = _events(Path(dirs[before["id"]]))
        first_after = _events(Path(dirs[after["id"]]))
        end = next(e["wall"] for e in first_before if e["type"] == "mark" and e["op"] == "run.end")
        waits.append(first_after[0]["wall"] - end)
        handovers.append(started[after["id"]] - ended[before["id"]])
        finishing.append(ended[before["id"]] - end)  # the run's end written -> the server has it ended
        starting.append(first_after[0]["wall"] - started[after["id"]])  # taken from the queue -> first command
    return {"wait_s": waits, "handover_s": handovers, "finishing_s": finishing, "starting_s": starting}


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def fill_catalog(results: Path, source: Path, runs: int) -> float:
    """`runs` copies of one real run folder in `results`, indexed -> seconds the indexing took."""
    from testbed.catalog import sync

    for i in range(runs):
        copy_run(source, results, i, started_offset_s=60.0 * i)
    start = time.monotonic()
    report = sync(results)
    if report.skipped:
        raise RuntimeError(f"copies not indexed: {report.skipped[:3]}")
    return time.monotonic() - start


class Browser:
    """A headless chromium, driven over the DevTools protocol (aiohttp's websocket client)."""

    def __init__(self, profile: Path) -> None:
        browser = chromium()
        if browser is None:
            raise RuntimeError("chromium not installed (apt-get install chromium)")
        self.proc, self.ws_url = start_chromium(browser, profile)
        self.loop = asyncio.new_event_loop()

    def first_paint(self, url: str) -> dict:
        return self.loop.run_until_complete(self._first_paint(url))

    async def _first_paint(self, url: str) -> dict:
        import aiohttp

        async with aiohttp.ClientSession() as http, http.ws_connect(self.ws_url, max_msg_size=0) as ws:
            devtools = DevTools(ws)
            call = devtools.call
            target_id, session = await devtools.open_tab()
            # From the document's first moment: when the catalog's rows are first in the DOM.
            watcher = """new MutationObserver((_, observer) => {
              if (document.querySelector("#catalog tbody tr")) {
                window.__catalogShown = performance.now(); observer.disconnect();
              }}).observe(document, {subtree: true, childList: true});"""
            await call("Page.addScriptToEvaluateOnNewDocument", {"source": watcher}, session)
            await call("Page.enable", {}, session)
            await call("Page.navigate", {"url": url}, session)
            measure = """new Promise(resolve => {
              const done = () => {
                const paint = performance.getEntriesByName("first-contentful-paint")[0];
                if (window.__catalogShown === undefined || paint === undefined) return setTimeout(done, 20);
                resolve(JSON.stringify({fcp_ms: paint.startTime, catalog_ms: window.__catalogShown,
                  rows: document.querySelectorAll("#catalog tbody tr").length}));
              };
              done();
            })"""
            result = await call(
                "Runtime.evaluate", {"expression": measure, "awaitPromise": True, "returnByValue": True}, session
            )
            await call("Target.closeTarget", {"targetId": target_id})
            return json.loads(result["result"]["value"])

    def close(self) -> None:
        self.loop.close()
        self.proc.kill()
        self.proc.wait()


def measure(
    hosts: int = 64, rounds: int = 5, queued: int = 20, catalog: int = 1000, console: Console | None = None
) -> dict:
    from emulators.twin import TwinProcess
    from testbed.documents import load_inventory
    from testbed.twin.bridge import twin_spec

    console = console or Console()
    binary = ansible_binary()
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    os.environ["TESTBED_CATALOG_DIR"] = str(work / "catalogs")  # beside the folders, not the user's cache
    os.environ[SERVE_DIR_ENV] = str(work / "no-server")  # the standalone runs find no server
    (work / "no-server").mkdir()
    inventory = work / "hosts.yaml"
    inventory.write_text(inventory_text(hosts))
    served, standalone, ansible = [], [], []
    ansible_failures: list[str] = []
    server = Server(inventory, work / "served", work / "serve")
    try:
        warm_started = time.monotonic()
        warm = server.client.submit(
            {"playbook": Path(HEALTH).read_text(), "playbook_file": HEALTH, "emulate": True, "trials": 1}
        )
        final = server.run_to_end(warm["id"])[-1]["run"]
        if final["status"] != "ok":
            raise RunFailed(f"the server's first run: {final['status']}: {final['error']}")
        console.print(f"server warm after {time.monotonic() - warm_started:.1f} s (its first run)")
        twin = None
        if binary is not None:
            twin = TwinProcess(twin_spec(load_inventory(inventory).model, 0), start_timeout=120)
            twin.__enter__()
            ini = ansible_inventory(twin.endpoints.devices, work / "ansible.ini")
        try:
            for r in range(rounds):
                ways = ["served", "standalone", "ansible"]
                for way in ways[r % 3 :] + ways[: r % 3]:  # each goes first in turn
                    if way == "served":
                        served.append(served_cold(server, inventory))
                    elif way == "standalone":
                        standalone.append(with_testbed(inventory, work / "standalone", 1)["cold_s"])
                    elif binary is not None:
                        tried = []
                        for forks in (5, hosts):
                            env = ansible_env(work / f"cp-{r}-{forks}", work / "ansible-home")
                            try:
                                tried.append(ansible_once(binary, ini, forks, env, hosts, work))
                            except RuntimeError as exc:  # hosts unreachable under load: said with the figures
                                ansible_failures.append(str(exc).splitlines()[0])
                        if tried:
                            ansible.append(min(tried))
                line = f"round {r + 1}/{rounds}: served {served[-1]:.2f} s, standalone {standalone[-1]:.2f} s"
                console.print(line + (f", ansible cold (best so far) {min(ansible):.2f} s" if ansible else ""))
        finally:
            if twin is not None:
                twin.__exit__(None, None, None)

        waits = queue_waits(server, inventory, queued)
        console.print(f"queued runs' wait p50 {stats(waits['wait_s'])['p50'] * 1000:.1f} ms (n={queued})")

        source = Path(server.client.runs()[0]["run_dir"])  # the newest run, copied as the catalog's runs
        index_s = fill_catalog(work / "served", source, catalog)
        console.print(f"{catalog} runs copied into the server's results, indexed in {index_s:.1f} s")
        browser = Browser(work / "chromium-profile")
        try:
            paints = [browser.first_paint(server.web_url) for _ in range(rounds)]
        finally:
            browser.close()
        console.print(f"web page: first paint p50 {stats([p['fcp_ms'] for p in paints])['p50']:.0f} ms")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    result: dict = {
        "hosts": hosts,
        "rounds": rounds,
        "served_cold_s": stats(served),
        "standalone_cold_s": stats(standalone),
        "ansible_cold_s": stats(ansible) if ansible else None,
        "ansible_missing": None if binary else "ansible not installed: pip install -e '.[bench]'",
        "ansible_failures": ansible_failures,
        "queued_runs": queued,
        "queue_wait_s": stats(waits["wait_s"]),
        "queue_handover_s": stats(waits["handover_s"]),
        "queue_finishing_s": stats(waits["finishing_s"]),
        "queue_starting_s": stats(waits["starting_s"]),
        "catalog_runs": catalog,
        "catalog_index_s": index_s,
        "page_fcp_ms": stats([p["fcp_ms"] for p in paints]),
        "page_catalog_ms": stats([p["catalog_ms"] for p in paints]),
        "page_catalog_rows": paints[0]["rows"],
    }
    result["standalone_over_served"] = result["standalone_cold_s"]["p50"] / result["served_cold_s"]["p50"]
    if ansible:
        result["ansible_over_served"] = result["ansible_cold_s"]["p50"] / result["served_cold_s"]["p50"]
        result["ansible_over_standalone"] = result["ansible_cold_s"]["p50"] / result["standalone_cold_s"]["p50"]
    return result


HOW = """**testbed serve** (`bench/serve.py`). A `testbed serve --emulate` of an inventory of 64 emulated GPU hosts
(the fan-out's), warmed by one run of `playbooks/gpu-health.yaml` before the rounds. Command to table, cold, in
rounds that turn which goes first: `testbed run playbooks/gpu-health.yaml --emulate --trials 1` in a fresh process,
from its start to the end of its first health step (the `health.wall` span's end in the run's events, on the
machine's monotonic clock), through the server (it finds its socket, submits the playbook's text, follows the run's
events, reads the summary from the run folder) against the same command finding no server (standalone: its own Ray,
twin and hubs), and against `ansible all -m raw` of the same commands over a twin's hosts, cold (a fresh
ControlPath: every host connected and authenticated; the best of -f 5 and -f 64), where ansible is installed. A
queued run's wait: 21 runs of the same playbook submitted at once to the warm server; for each of the 20 behind the
first, from the run before it ending (its `run.end` event) to its own first event (its first device command, the
devices reused), and the server's hand-over alone (the queue's `run.ended` of one -> `run.started` of the next).
The web page: 1,000 copies of one real run (`tests/catalog/catalog_copies.py`) in the server's results folder,
indexed; the page (`--web`) opened in a fresh tab of a headless chromium, round by round: navigation -> first
contentful paint, and -> the catalog's rows in the DOM (its newest 200, from `GET /catalog`, which brings the catalog
up to the folders first)."""


def rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    """RESULTS.md's rows (figure, measured, baseline, ratio, target, met) of this bench's figures."""
    served, alone, ansible = f["served_cold_s"], f["standalone_cold_s"], f["ansible_cold_s"]

    def s(x: dict) -> str:
        return f"p50 {x['p50']:.2f} s (max {x['max']:.2f} s, n={x['n']})"

    command = f"`testbed run playbooks/gpu-health.yaml --emulate --trials 1`, {f['hosts']} hosts, cold, to the table"
    out = []
    failures = f.get("ansible_failures") or []
    failed = f"; {len(failures)} Ansible tries left hosts unreachable, not counted" if failures else ""
    if ansible is not None:
        out.append(
            (
                f"testbed serve: {command}, through a warm server",
                s(served),
                f"Ansible cold {s(ansible)}{failed}",
                f"{f['ansible_over_served']:.2f}x faster",
                ">= 3x faster than Ansible cold",
                "yes" if f["ansible_over_served"] >= 3 else "**no**",
            )
        )
        out.append(
            (
                f"testbed serve: {command}, standalone (no server)",
                s(alone),
                f"Ansible cold {s(ansible)}",
                f"{f['ansible_over_standalone']:.2f}x",
                "above Ansible cold (> 1x)",
                "yes" if f["ansible_over_standalone"] > 1 else "**no**",
            )
        )
    else:
        out.append(
            (
                f"testbed serve: {command}, through a warm server",
                s(served),
                f"standalone {s(alone)}; Ansible: {f['ansible_missing']}",
                f"{f['standalone_over_served']:.2f}x faster than standalone",
                ">= 3x faster than Ansible cold",
                "n/a",
            )
        )
    out.append(
        (
            "testbed serve: through the server vs standalone (same rounds)",
            s(served),
            f"standalone {s(alone)}",
            f"{f['standalone_over_served']:.2f}x faster",
            "(diagnosis)",
            "n/a",
        )
    )
    wait, handover = f["queue_wait_s"], f["queue_handover_s"]
    out.append(
        (
            "testbed serve: a queued run's wait after the run before it ends (run.end -> its first device command)",
            f"p50 {wait['p50'] * 1000:.1f} ms, max {wait['max'] * 1000:.1f} ms (n={wait['n']})",
            f"the server's hand-over alone (run.ended -> run.started): p50 {handover['p50'] * 1000:.1f} ms; "
            f"before it, the run's end written -> ended p50 {f['queue_finishing_s']['p50'] * 1000:.1f} ms; after "
            f"it, started -> first command p50 {f['queue_starting_s']['p50'] * 1000:.1f} ms",
            "",
            "p50 <= 50 ms",
            "yes" if wait["p50"] <= 0.05 else "**no**",
        )
    )
    fcp, shown = f["page_fcp_ms"], f["page_catalog_ms"]
    out.append(
        (
            f"testbed serve: the web page's first paint, {f['catalog_runs']:,} runs in the catalog (headless chromium)",
            f"first contentful paint p50 {fcp['p50']:.0f} ms (max {fcp['max']:.0f} ms, n={fcp['n']})",
            f"the catalog's {f['page_catalog_rows']} newest rows drawn: p50 {shown['p50']:.0f} ms",
            "",
            "<= 1 s",
            "yes" if fcp["p50"] <= 1000 and shown["p50"] <= 1000 else "**no**",
        )
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queued", type=int, default=20)
    parser.add_argument("--catalog", type=int, default=1000)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.hosts, args.rounds, args.queued, args.catalog, console=console)
    write_out("serve", result)
    for row in rows(result):
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
