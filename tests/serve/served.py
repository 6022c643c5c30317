"""A `testbed serve --emulate` process for the tests, started and stopped as a lab starts and stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from serve_processes import DidNotListen, read_until_listening

from testbed.serve.client import Client
from testbed.serve.identity import SERVE_DIR_ENV

OCS_RECONFIG = "playbooks/ocs-reconfig.yaml"
# A run that holds the queue until it is cancelled: the runs submitted behind it are queued for certain.
BLOCKER = """\
name: blocker
description: holds the server's queue until cancelled
trials: 1
setup:
  - {action: fabric.clear}
steps:
  - {action: wait, ms: 3600000}
"""
SHORT = BLOCKER.replace("ms: 3600000", "ms: 1")  # a run that ends at once
EVENT_WAIT_S = 120  # bound on waiting for the server's next event (a slow CI machine), not a timing claim


class Served:
    """A running `testbed serve --emulate`: its process, socket folder, results folder and a root client."""

    def __init__(
        self,
        repo: Path,
        results: Path,
        serve_dir: Path,
        *,
        web: bool = False,
        options: tuple[str, ...] = (),
        env: dict | None = None,
    ) -> None:
        self.results, self.serve_dir = results, serve_dir
        self.env = os.environ | (env or {}) | {SERVE_DIR_ENV: str(serve_dir)}
        web_option = ["--web", "127.0.0.1:0"] if web else []  # port 0: a free one, which the server says
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testbed", "serve", "--emulate", "--results", str(results), *web_option, *options],
            cwd=repo,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a test may kill its whole process group, as systemd's SIGKILL would
        )
        try:
            listening = read_until_listening(self.proc)
        except DidNotListen as ended:
            pytest.fail(str(ended))
        self.socket, self.said = listening.socket, listening.said
        if listening.web_url is not None:
            self.web_url = listening.web_url
        self.client = Client(self.socket, timeout=EVENT_WAIT_S)

    def stop(self) -> str:
        """SIGTERM, as systemd stops it -> what it printed."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=120)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.communicate()
        return "".join(self.said) + out

    def events_until(self, done: Callable[[dict], bool], since: int = 0) -> list[dict]:
        """The server's events from `since` up to the first that meets `done` (read as the server sends them)."""
        seen = []
        for event in self.client.events(since=since, timeout=EVENT_WAIT_S):
            seen.append(event)
            if done(event):
                return seen
        pytest.fail(f"the server's events ended before the one awaited: {[e['type'] for e in seen]}")

    def submit(self, playbook: str, **options) -> dict:
        return self.client.submit({"playbook": playbook, "playbook_file": "blocker.yaml", "emulate": True} | options)


def started(run_id: str) -> Callable[[dict], bool]:
    return lambda e: e["type"] == "run.started" and e["run"]["id"] == run_id


def waiting(run_id: str) -> Callable[[dict], bool]:
    """The run is in its `wait` step: it has its folder, its devices are up."""
    return lambda e: e["type"] == "run.progress" and e["run"]["id"] == run_id and e["data"]["op"] == "wait"


def ended(run_id: str) -> Callable[[dict], bool]:
    return lambda e: e["type"] == "run.ended" and e["run"]["id"] == run_id
