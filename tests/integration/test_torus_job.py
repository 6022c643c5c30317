"""A training job over a 2-D torus fabric, end to end on the twin: the ranks' ring (r -> r+1) runs on torus
links, through the twin's data plane, and a failover rewires the torus through a spare.

A duplex torus needs four optical ports per host (x forward / back, y forward / back); the default
inventory has two per host on the OCS, so this test writes its own: one 32x32 OCS, eight hosts with p0..p3.
A 2x3 torus: rank 3 -> 4 -> 5 run back along the second row, so both directions of an x link carry the ring.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main

HOSTS = [f"gpu{i:02d}" for i in range(1, 9)]  # gpu07 and gpu08 are the spares
PORTS = ["p0", "p1", "p2", "p3"]
SIZE = 32

PLAYBOOK = """\
name: torus-failover
trials: 1
seed: 3
job:
  command: [testbed-train, --steps, "1000000", --dim, "32", --step-time, "0.02", --checkpoint-every, "5",
            --timeout, "10"]
  ranks: [gpu01, gpu02, gpu03, gpu04, gpu05, gpu06]
  fabric: {topology: torus2d, dims: [2, 3], port: p0, reverse_port: p1, y_port: p2, y_reverse_port: p3}
steps:
  - {action: job.start, wait_steps: 10}
  - {action: failover, fault: {kind: gpu.fail}, heartbeat_ms: 50, timeout_ms: 30000}
  - {action: job.stop}
"""


def torus_inventory() -> dict:
    devices: dict = {
        "ocs1": {
            "kind": "ocs",
            "driver": "polatis-scpi",
            "transport": {"type": "visa", "resource": "TCPIP0::192.0.2.10::5025::SOCKET"},
            "size": SIZE,
        }
    }
    fibres = []
    for host in HOSTS:
        devices[host] = {
            "kind": "gpu_host",
            "driver": "ssh",
            "transport": {"type": "ssh", "host": f"{host}.lab.example", "user": "lab"},
            "gpus": 1,
            "ports": PORTS,
            "rack": "rack1",
        }
        for port in PORTS:
            k = len(fibres) + 1
            fibres.append({"host": host, "port": port, "switch": "ocs1", "ingress": k, "egress": SIZE + k})
    return {"name": "torus-rack", "emulated_only": True, "devices": devices, "fibres": fibres, "spares": HOSTS[6:]}


@pytest.fixture(scope="module")
def run_dir(ray_cluster, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("torus")
    inventory, playbook = tmp / "torus-rack.yaml", tmp / "torus-failover.yaml"
    inventory.write_text(yaml.safe_dump(torus_inventory(), sort_keys=False))
    playbook.write_text(PLAYBOOK)
    code = main(["run", str(playbook), "--emulate", "--inventory", str(inventory), "--results", str(tmp / "r")])
    assert code == 0
    return next((tmp / "r").iterdir())


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_the_job_trains_over_the_torus_and_resumes_on_a_spare(run_dir):
    evs = events(run_dir)
    first = [e for e in evs if e["op"] == "ocs.reconfigure" and e["type"] == "invoke"][0]
    # 6 hosts x 4 ports, each transmitting into one circuit (the event abbreviates long lists)
    assert first["data"]["circuits"] == "24 items"
    resumed = [e for e in evs if e["op"] == "failover.resumed"]
    assert len(resumed) == 1 and resumed[0]["device"] in ("gpu07", "gpu08")
    assert resumed[0]["data"]["resumed_from"] > 0
    assert resumed[0]["data"]["step"] == resumed[0]["data"]["resumed_from"] + 1  # trained again after the swap
    # Every rank reached its ring neighbour through a relay of the twin's data plane (one per rank and
    # launch), which carries bytes only while the torus link between the two hosts is lit both ways.
    totals = json.loads((run_dir / "run.json").read_text())["twin_dataplane"]
    assert totals["relays"] >= 2 * 6 and totals["bytes"] > 0
    assert main(["check", str(run_dir)]) == 0
