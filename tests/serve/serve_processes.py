"""Starting the processes that tests/serve's tests and bench/serve.py both drive: a `testbed serve` (read until it
says where it listens) and a headless chromium (read until it says where its DevTools protocol listens), and the
protocol's calls. Free of pytest: the bench imports it from this folder (its path from bench/benchlib.py's REPO).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking")


class DidNotListen(RuntimeError):
    """The process ended before it said where it listens; the message has what it said."""


@dataclass
class Listening:
    """Where a `testbed serve` said it listens: its socket, its web page if it serves one, and what it said."""

    socket: Path
    web_url: str | None
    said: list[str] = field(default_factory=list)


def read_until_listening(proc: subprocess.Popen) -> Listening:
    """Reads a starting `testbed serve`'s output up to its "listening on" line (it says where it listens once its
    socket answers); raises DidNotListen if it ends first.
    """
    said: list[str] = []
    web_url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        said.append(line)
        if line.startswith("web page (read-only) at "):
            web_url = line.removeprefix("web page (read-only) at ").strip()
        if line.startswith("listening on "):
            return Listening(Path(line.removeprefix("listening on ").strip()), web_url, said)
    raise DidNotListen(f"testbed serve ended before it listened: {''.join(said)}")


def chromium() -> str | None:
    """Debian's chromium, under either of its names, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def start_chromium(browser: str, profile: Path) -> tuple[subprocess.Popen, str]:
    """A headless chromium on about:blank with its own profile -> (its process, its DevTools websocket's URL);
    raises DidNotListen if it ends before it says the URL. Its later words are read and dropped, so that a full
    pipe never stops it.
    """
    proc = subprocess.Popen(
        [browser, *BROWSER_FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"DevTools listening on (ws://\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, found.group(1)
    raise DidNotListen("chromium ended before it listened for DevTools")


class DevTools:
    """Calls over a DevTools websocket (aiohttp's), one at a time; the events that arrive meanwhile are kept."""

    def __init__(self, ws) -> None:
        self.ws, self.ids, self.events = ws, 0, []

    async def call(self, method: str, params: dict, session: str | None = None) -> dict:
        """The result of `method`; raises RuntimeError with the browser's error if it refuses it."""
        self.ids += 1
        message = {"id": self.ids, "method": method, "params": params} | ({"sessionId": session} if session else {})
        await self.ws.send_json(message)
        while True:
            reply = await self.ws.receive_json()
            if reply.get("id") == self.ids:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    async def open_tab(self) -> tuple[str, str]:
        """A new tab on about:blank, attached -> (its target id, the session its calls name)."""
        target = await self.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        return target["targetId"], attached["sessionId"]
