"""The warm session (testbed.Lab): runs that need the same devices reuse the twin and the hubs, each run is
still a run of its own (folder, ground truth, check), the session holds its devices' locks, and another
playbook's devices replace the ones up.
"""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

import testbed
from testbed.contracts.errors import UserError
from testbed.engine.locks import device_locks
from testbed.leases.identity import device_identity
from testbed.ops.check import check_run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _info(run) -> dict:
    return json.loads((run.folder / "run.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_warm_lab_reuses_its_devices_and_keeps_each_run_apart(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True)) as lab:
        first = lab.run(repo / "playbooks/ocs-reconfig.yaml", trials=1)
        second = lab.run(repo / "playbooks/ocs-reconfig.yaml", trials=2)
        assert first.ok and second.ok, (first.error, second.error)
        assert first.folder != second.folder

        one, two = _info(first), _info(second)
        assert "devices_reused" not in one["startup_s"] and "twin" in one["startup_s"]
        assert two["startup_s"]["devices_reused"] is True
        assert one["twin_pid"] == two["twin_pid"] and _alive(two["twin_pid"])
        assert one["actors"]["ocs1"]["pid"] == two["actors"]["ocs1"]["pid"]  # the same hub, still connected

        # Each run's ground truth in its own folder: the first run's file ends where that run ended.
        truth_one = (first.folder / "twin_truth.jsonl").read_text()
        assert (second.folder / "twin_truth.jsonl").is_file()
        assert (first.folder / "twin_truth.jsonl").read_text() == truth_one

        # The spans table: one row per measured span, as the summary counts them.
        rows = second.spans
        assert {r["span"] for r in rows} == set(second.summary["spans"])
        assert sum(r["span"] == "reconfig.total" for r in rows) == second.summary["spans"]["reconfig.total"]["n"]
        assert {r["trial"] for r in rows} == {0, 1}
        assert all(isinstance(r["duration_ms"], float) for r in rows)
        assert any(e["op"] == "run.end" for e in second.events())

        for run in (first, second):
            assert check_run(run.folder).ok, check_run(run.folder).checks

        # The session holds the switch while its hub is connected: another run cannot take it.
        # (the lock is on the device the hub connects to: the twin's, from the inventory pointed at it)
        twin_address = device_identity(lab._devices.inventory.devices["ocs1"].transport)
        assert "127.0.0.1" in twin_address
        with pytest.raises(UserError, match="in use by another testbed run"):
            with device_locks({"ocs1": twin_address}, "another run"):
                pass

        # Another playbook's devices: the ones up are stopped and the run brings up its own.
        health = lab.run(repo / "playbooks/gpu-health.yaml")
        assert health.ok, health.error
        three = _info(health)
        assert "devices_reused" not in three["startup_s"]
        assert three["twin_pid"] != two["twin_pid"] and not _alive(two["twin_pid"])
        with device_locks({"ocs1": twin_address}, "another run"):
            pass  # released with the devices that held it
    assert not _alive(three["twin_pid"])  # closing the Lab stops its devices


def test_a_closed_lab_refuses_to_run(repo, tmp_path):
    lab = testbed.Lab(repo / "playbooks/inventory/emulated-rack.yaml", emulate=True, results=tmp_path)
    lab.close()
    with pytest.raises(UserError, match="closed"):
        lab.run(repo / "playbooks/ocs-reconfig.yaml")


def test_an_emulated_only_inventory_needs_emulate(repo, tmp_path):
    with pytest.raises(UserError, match="emulated_only"):
        testbed.Lab(repo / "playbooks/inventory/opus-2048.yaml", results=tmp_path)
