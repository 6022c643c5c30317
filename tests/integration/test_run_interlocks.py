"""The inventory's interlocks hold at run time, in `testbed run`'s own device actors.

The planner can only check what the playbook names. What a switch already holds is known only at run
time: here another group's circuit occupies ingress 1 towards a reserved egress port (40), and the
playbook's configuration needs ingress 1. Making the change would cut that circuit, a write to a reserved
port; the actor's guard refuses it before anything is sent, the run records the refusal, and the other
group's circuit is still there at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.cli.main import main

INVENTORY = """\
name: shared-switch
emulated_only: true
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {type: visa, resource: "TCPIP0::192.0.2.10::5025::SOCKET"}
    size: 32
    reserved_ports: [40]
    emulation: {switching_time_ms: 5, jitter_ms: 0, circuits: [[1, 40]]}
  gpu01: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu01.example, user: lab}}
  gpu02: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu02.example, user: lab}}
fibres:
  - {host: gpu01, port: p0, switch: ocs1, ingress: 1, egress: 33}
  - {host: gpu02, port: p0, switch: ocs1, ingress: 2, egress: 34}
"""

PLAYBOOK = """\
name: collide
trials: 1
configurations:
  one-way: {links: ["gpu01:p0 -> gpu02:p0"]}
steps:
  - {action: fabric.apply, configuration: one-way, verify_light: false}
"""


def test_a_write_to_a_reserved_port_is_refused_by_the_runs_actor(ray_cluster, tmp_path, capsys):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "playbook.yaml").write_text(PLAYBOOK)
    argv = ["--inventory", str(tmp_path / "inventory.yaml")]
    assert main(["plan", str(tmp_path / "playbook.yaml"), *argv]) == 0  # the planner sees no problem
    capsys.readouterr()

    code = main(["run", str(tmp_path / "playbook.yaml"), *argv, "--emulate", "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == 1
    assert "reserved" in out.err and "[40]" in out.err
    run_dir = Path(out.out.strip().splitlines()[-1].removeprefix("results: "))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    refused = [e for e in events if e["op"] == "ocs.reconfigure" and e["type"] == "fail"]
    assert len(refused) == 1
    assert refused[0]["data"]["error_type"] == "InterlockError"
    assert "[40]" in refused[0]["data"]["error"]

    audit = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    writes = [a["data"] for a in audit if a["direction"] == "tx" and ":CONN:" in a["data"].upper()]
    assert not [w for w in writes if "SUB" in w.upper() or "ADD" in w.upper()], writes  # nothing reached the wire
    final = next(e for e in events if e["op"] == "fabric.final")
    assert final["data"]["circuits"]["ocs1"] == {"1": 40}  # the other group's circuit is still there

    assert main(["check", str(run_dir)]) == 0
