"""The run's devices are served by one hub actor per node (testbed/engine/hub.py); a switch, and a device marked
`isolated` in the inventory, have a process of their own, so a crash of its driver's process takes no other
device down.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from runner_process import cli, read_events, start_run, wait_for_event
from test_actor_death import PLAYBOOK


def inventory_with_isolated(repo: Path, tmp_path: Path, device: str) -> Path:
    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    entry = f"  {device}:\n    kind: gpu_host\n"
    assert entry in text
    path = tmp_path / "rack.yaml"
    path.write_text(text.replace(entry, entry + "    isolated: true\n"))
    return path


LAYOUT = """\
name: hub-layout
description: every GPU host's health, and a circuit on the switch
trials: 1
configurations:
  one: {circuits: {ocs1: [[1, 40]]}}
steps:
  - {action: hosts.health}
  - {action: fabric.apply, configuration: one}
teardown:
  - {action: fabric.clear}
"""


def test_hosts_share_one_hub_a_switch_and_an_isolated_device_have_a_process_each(repo, tmp_path):
    inventory = inventory_with_isolated(repo, tmp_path, "gpu02")
    playbook = tmp_path / "layout.yaml"
    playbook.write_text(LAYOUT)
    results = tmp_path / "results"
    done = cli("run", str(playbook), "--emulate", "--inventory", str(inventory), "--results", str(results), cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(results.iterdir())
    pids = {name: a["pid"] for name, a in json.loads((run_dir / "run.json").read_text())["actors"].items()}
    assert len(pids) == 11  # every GPU host of the inventory, and the switch
    shared = {pid for name, pid in pids.items() if name not in ("gpu02", "ocs1")}
    assert len(shared) == 1
    assert len({*shared, pids["gpu02"], pids["ocs1"]}) == 3


def test_an_isolated_devices_crash_touches_no_other_device(repo, tmp_path):
    playbook = tmp_path / "actor-death.yaml"
    playbook.write_text(PLAYBOOK.format(policy="restart"))
    inventory = inventory_with_isolated(repo, tmp_path, "gpu01")
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook), "--emulate", "--inventory", str(inventory), "--results", str(results)])
    try:
        run_dir = wait_for_event(results, proc, "gpu.step_times", "invoke")
        actors = json.loads((run_dir / "run.json").read_text())["actors"]
        assert actors["gpu01"]["pid"] != actors["gpu02"]["pid"]
        os.kill(actors["gpu01"]["pid"], signal.SIGKILL)  # gpu01's process, in the middle of the measurement
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = read_events(run_dir / "events.jsonl")
    lost = [e for e in events if e["type"] == "info" and e.get("device")]
    assert lost and {e["device"] for e in lost} == {"gpu01"}  # only the crashed device's calls are in doubt
    restarted = [e["device"] for e in events if e["op"] == "actor.restarted"]
    assert restarted and set(restarted) == {"gpu01"}
    ends = {e["trial"]: e["data"] for e in events if e["op"] == "trial.end"}
    assert ends[1]["status"] == "ok"
    assert cli("check", str(run_dir), cwd=repo).returncode == 0
