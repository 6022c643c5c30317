"""The engine reaches its hubs over their direct channels (testbed/engine/direct.py) once they are up, and a hub
Ray restarts after its process died gets a new channel: its calls went through Ray meanwhile.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from rich.console import Console

import testbed
from testbed.engine.dispatch import ActorLost

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_calls_go_over_direct_channels_and_a_restarted_hub_gets_a_new_one(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True)) as lab:
        first = lab.run(repo / "playbooks/ocs-reconfig.yaml", trials=1)
        assert first.ok, first.error
        dispatcher = lab._devices.dispatcher
        assert all(dispatcher.direct(name) for name in dispatcher.names())

        before = json.loads((first.folder / "run.json").read_text())["actors"]["ocs1"]["pid"]
        assert dispatcher.call("ocs1", "where").result(30)["pid"] == before
        os.kill(before, signal.SIGKILL)  # the switch's hub process dies; Ray restarts it
        deadline = time.monotonic() + 120
        while True:  # as the engine's wait_until_alive: ask until the restarted hub answers
            assert time.monotonic() < deadline, "the switch's hub was not restarted"
            try:
                after = dispatcher.call("ocs1", "where").result(30)["pid"]
            except ActorLost:
                continue
            if after != before:
                break
        dispatcher.settle()
        assert dispatcher.direct("ocs1")  # a new channel to the new process
        assert dispatcher.call("ocs1", "where").result(30)["pid"] == after

        second = lab.run(repo / "playbooks/ocs-reconfig.yaml", trials=1)
        assert second.ok, second.error
