"""`testbed run` as a separate process (the console script, exit codes, --ray-address), and a run whose
light check fails as it would on the lab: a circuit from a port no host transmits on stays dark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli.main import main

DARK_PLAYBOOK = """\
name: dark-port
trials: 2
configurations:
  lit: {circuits: {ocs1: [[1, 40]]}}     # ingress 1 is gpu01:p0's transmitter
  dark: {circuits: {ocs1: [[25, 41]]}}   # nothing is cabled to ingress 25
steps:
  - {action: fabric.apply, configuration: lit, measure: reconfig}
  - {action: fabric.apply, configuration: dark, measure: reconfig, timeout_ms: 200}
teardown:
  - {action: fabric.clear}
"""


@pytest.mark.parametrize("given_by", ["--ray-address", "RAY_ADDRESS"])
def test_run_in_its_own_process_joining_a_ray_cluster(ray_cluster, repo, tmp_path, given_by):
    """The lab's cluster is joined when named by --ray-address or, as Ray's own tools do, by $RAY_ADDRESS."""
    address = ray_cluster.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "testbed", "run", "playbooks/ocs-reconfig.yaml", "--emulate", "--trials", "2"]
    command += ["--results", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if given_by == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    else:
        command += ["--ray-address", address]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("results: ")
    run_dir = Path(last.removeprefix("results: "))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spans"]["reconfig.ack"]["n"] == 6
    assert json.loads((run_dir / "run.json").read_text())["ray_address"] == address  # heal joins it again
    assert "Traceback" not in proc.stderr


def test_a_dark_circuit_fails_the_experiment_with_exit_code_1(ray_cluster, repo, tmp_path, capsys):
    playbook = tmp_path / "dark.yaml"
    playbook.write_text(DARK_PLAYBOOK)
    code = main(
        [
            "run",
            str(playbook),
            "--emulate",
            "--results",
            str(tmp_path / "results"),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    out = capsys.readouterr()
    assert code == 1
    assert "no light on 1 egress port(s)" in out.err and "41" in out.err
    run_dir = Path(out.out.strip().splitlines()[-1].removeprefix("results: "))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["trials"] == {"planned": 2, "ok": 0, "failed": 1}  # on_failure: abort stops after trial 0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    fails = [e for e in events if e["type"] == "fail" and e.get("device") == "ocs1"]
    assert fails and fails[0]["data"]["error_type"] == "VerificationError"
    # Teardown ran after the failure: the last device operation is the clear, and it succeeded.
    device_ops = [e for e in events if e.get("device") == "ocs1" and e["type"] in ("ok", "fail")]
    assert device_ops[-1]["op"] == "ocs.connections"  # the final read-back, for `testbed check`
    assert device_ops[-2]["op"] == "ocs.clear" and device_ops[-2]["type"] == "ok"


def test_real_run_of_an_emulated_only_inventory_is_refused(repo, capsys):
    code = main(
        [
            "run",
            str(repo / "playbooks/ocs-reconfig.yaml"),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    assert code == 2
    assert "--emulate" in capsys.readouterr().err
