"""Devices pinned to Ray nodes get their actors there: a 3-node test cluster on this machine, two
switches pinned to two labelled control hosts, a run through the CLI joining that cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

INVENTORY = """\
name: two-control-hosts
devices:
  ocs-a:
    kind: ocs
    driver: polatis-scpi
    transport: {type: serial, port: /dev/ttyUSB0}
    size: 8
    node: ctrl-a
    emulation: {switching_time_ms: 5, jitter_ms: 0}
  ocs-b:
    kind: ocs
    driver: polatis-scpi
    transport: {type: visa, resource: "TCPIP0::192.0.2.20::5025::SOCKET"}
    size: 8
    node: ctrl-b
    emulation: {switching_time_ms: 5, jitter_ms: 0}
  gpu01: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu01.lab.example, user: lab}, ports: [p0, p1]}
  gpu02: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu02.lab.example, user: lab}, ports: [p0, p1]}
fibres:
  - {host: gpu01, port: p0, switch: ocs-a, ingress: 1, egress: 9}
  - {host: gpu02, port: p0, switch: ocs-a, ingress: 2, egress: 10}
  - {host: gpu01, port: p1, switch: ocs-b, ingress: 1, egress: 9}
  - {host: gpu02, port: p1, switch: ocs-b, ingress: 2, egress: 10}
"""

PLAYBOOK = """\
name: two-rails
trials: 2
configurations:
  pair: {links: ["gpu01:p0 <-> gpu02:p0", "gpu01:p1 <-> gpu02:p1"]}
steps:
  - {action: fabric.apply, configuration: pair, measure: reconfig}
  - {action: fabric.clear}
"""


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {name: cluster.add_node(num_cpus=1, labels={"testbed-node": name}) for name in ("ctrl-a", "ctrl-b")}
    yield cluster, {name: node.node_id for name, node in nodes.items()}
    cluster.shutdown()


def test_pinned_devices_run_on_their_nodes_and_clocks_are_recorded(cluster, repo, tmp_path):
    cluster, node_ids = cluster
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "playbook.yaml").write_text(PLAYBOOK)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed",
            "run",
            str(tmp_path / "playbook.yaml"),
            "--inventory",
            str(tmp_path / "inventory.yaml"),
            "--emulate",
            "--results",
            str(tmp_path / "results"),
            "--ray-address",
            cluster.address,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    info = json.loads((run_dir / "run.json").read_text())
    placement = info["placement"]
    assert placement["ocs-a"]["node_id"] == node_ids["ctrl-a"]
    assert placement["ocs-b"]["node_id"] == node_ids["ctrl-b"]
    for device in ("ocs-a", "ocs-b"):
        # Same machine, so the offset is within the measurement's own error bound (plus scheduling noise).
        p = placement[device]
        assert abs(p["clock_offset_ms"]) <= p["offset_error_bound_ms"] + 5, p
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["spans"]["reconfig.ack"]["n"] == 2


def test_a_pin_to_a_missing_node_is_a_clear_error_on_a_real_run(cluster, repo, tmp_path):
    cluster, _ = cluster
    # A real run: the addresses must be loopback too (ports 7 and 9 are closed), in case placement ever let it
    # start; two ports, as two switches are two devices.
    inventory = (
        INVENTORY.replace("node: ctrl-b", "node: ctrl-z")
        .replace("192.0.2.20::5025", "127.0.0.1::7")
        .replace("port: /dev/ttyUSB0", "port: socket://127.0.0.1:9")
    )
    (tmp_path / "inventory.yaml").write_text(inventory)
    (tmp_path / "playbook.yaml").write_text(PLAYBOOK)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed",
            "run",
            str(tmp_path / "playbook.yaml"),
            "--inventory",
            str(tmp_path / "inventory.yaml"),
            "--yes",
            "--results",
            str(tmp_path / "results"),
            "--ray-address",
            cluster.address,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ocs-b is pinned to Ray node 'ctrl-z', which is not in the cluster" in proc.stderr
    assert "Traceback" not in proc.stderr
