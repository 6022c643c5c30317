"""What a warm session (testbed.Lab) keeps between runs stays a true record: the clocks measured by the first run on
the devices are reused by the next and run.json says so (when and by which run they were measured), a hub restarted
since has them measured again, and with index_behind (testbed serve's) every run reaches the catalog by the time the
session closes, as each standalone run's end puts it there.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from rich.console import Console

import testbed
from testbed.catalog import select_runs
from testbed.engine.dispatch import ActorLost
from testbed.ops.check import check_run

pytestmark = pytest.mark.usefixtures("ray_cluster")

RECONFIG = "playbooks/ocs-reconfig.yaml"
RESTART_WAIT_S = 120  # bound on Ray restarting a killed hub on a slow CI machine, not a timing claim


def _info(run) -> dict:
    return json.loads((run.folder / "run.json").read_text())


def test_the_second_run_on_warm_devices_reuses_the_first_run_s_clocks_and_says_so(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True)) as lab:
        first = lab.run(repo / RECONFIG, trials=1)
        second = lab.run(repo / RECONFIG, trials=1)
    assert first.ok and second.ok, (first.error, second.error)
    one, two = _info(first), _info(second)
    assert one["placement_clocks"]["reused"] is False
    assert one["placement_clocks"]["measured_in"] == one["run"]
    assert two["placement_clocks"] == {**one["placement_clocks"], "reused": True}  # when, and by the first run
    assert two["placement"] == one["placement"]
    assert set(two["placement"]) == set(two["actors"])  # every actor's node and offset, as a measured run has
    for run in (first, second):
        assert check_run(run.folder).ok, check_run(run.folder).checks


def test_a_hub_restarted_between_runs_has_its_clocks_measured_again(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True)) as lab:
        first = lab.run(repo / RECONFIG, trials=1)
        one = _info(first)
        os.kill(one["actors"]["ocs1"]["pid"], signal.SIGKILL)  # Ray restarts the hub: another process
        _until_restarted(lab._devices.dispatcher, "ocs1", one["actors"]["ocs1"]["pid"])
        second = lab.run(repo / RECONFIG, trials=1)
    assert second.ok, second.error
    two = _info(second)
    assert two["actors"]["ocs1"]["pid"] != one["actors"]["ocs1"]["pid"], "the hub was not restarted"
    assert two["placement_clocks"]["reused"] is False and two["placement_clocks"]["measured_in"] == two["run"]
    assert two["placement_clocks"]["measured_utc"] > one["placement_clocks"]["measured_utc"]


def _until_restarted(dispatcher, actor: str, was: int) -> None:
    """Until the actor answers from a process other than `was` (calls to it fail while Ray restarts it)."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            if dispatcher.call(actor, "where").result(timeout=RESTART_WAIT_S)["pid"] != was:
                return
        except ActorLost:
            pass
        assert time.monotonic() < deadline, f"{actor} was not restarted"


def test_runs_indexed_behind_the_next_one_are_all_in_the_catalog_once_the_lab_closes(repo, tmp_path):
    inventory = repo / "playbooks/inventory/emulated-rack.yaml"
    with testbed.Lab(inventory, emulate=True, results=tmp_path, console=Console(quiet=True), index_behind=True) as lab:
        runs = [lab.run(repo / RECONFIG, trials=1) for _ in range(3)]
    assert all(run.ok for run in runs), [run.error for run in runs]
    indexed = {row["folder"]: row for row in select_runs(tmp_path, sync_first=False)}  # nothing synced since
    assert set(indexed) == {run.folder.name for run in runs}
    assert all(indexed[run.folder.name]["status"] == "ok" for run in runs)
