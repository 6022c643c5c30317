"""A link between hosts on two switches, end to end: `testbed run --emulate` routes it over the inventory's
trunks, sets one circuit on each switch, and verifies light on both, where the light on the second
switch's egress came through the first switch and the trunk (the twin couples the switches' monitors).
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.cli.main import main

INVENTORY = """\
name: two-switches
emulated_only: true
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "TCPIP0::192.0.2.10::5025::SOCKET"}}
    size: 16
    emulation: {{switching_time_ms: 5, jitter_ms: 0}}
  ocs2:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "TCPIP0::192.0.2.11::5025::SOCKET"}}
    size: 16
    emulation: {{switching_time_ms: 5, jitter_ms: 0}}
  gpu01: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: gpu01.lab.example, user: lab}}}}
  gpu02: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: gpu02.lab.example, user: lab}}}}
fibres:
  - {{host: gpu01, port: p0, switch: ocs1, ingress: 1, egress: 17}}
  - {{host: gpu02, port: p0, switch: ocs2, ingress: 1, egress: 17}}
trunks:
  - {{from: ocs1, egress: 32, to: ocs2, ingress: 16, loss_db: {loss}}}
  - {{from: ocs2, egress: 32, to: ocs1, ingress: 16, loss_db: {loss}}}
"""

PLAYBOOK = """\
name: across-two-switches
trials: 2
configurations:
  across: {links: ["gpu01:p0 <-> gpu02:p0"]}
setup:
  - {action: fabric.clear}
steps:
  - {action: fabric.apply, configuration: across, measure: reconfig}
teardown:
  - {action: fabric.clear}
"""


def write(tmp_path: Path, loss: float) -> tuple[Path, Path]:
    inventory, playbook = tmp_path / "two-switches.yaml", tmp_path / "across.yaml"
    inventory.write_text(INVENTORY.format(loss=loss))
    playbook.write_text(PLAYBOOK)
    return inventory, playbook


def test_a_link_across_two_switches_is_lit_through_both(ray_cluster, tmp_path, capsys):
    inventory, playbook = write(tmp_path, loss=0.5)
    argv = ["run", str(playbook), "--emulate", "--inventory", str(inventory), "--results", str(tmp_path / "r")]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    run_dir = Path(out.strip().splitlines()[-1].removeprefix("results: "))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for trial in (0, 1):
        done = {
            e["device"]: e
            for e in events
            if e.get("trial") == trial and e["op"] == "ocs.reconfigure" and e["type"] == "ok"
        }
        assert set(done) == {"ocs1", "ocs2"}
        lit = {e["device"] for e in events if e.get("trial") == trial and e["type"] == "mark" and e["op"] == "lit"}
        assert lit == {"ocs1", "ocs2"}  # light verified on both switches
        for switch, e in done.items():
            # Each switch's host egress reads the other host's 0 dBm less both switches (1 dB each) and
            # the trunk (0.5 dB): the light crossed both switches.
            assert e["data"]["value"]["min_power_dbm"] == -2.5, (switch, e)
    invokes = {
        e["device"]: e["data"]["circuits"] for e in events if e["op"] == "ocs.reconfigure" and e["type"] == "invoke"
    }
    assert invokes == {"ocs1": [[1, 32], [16, 17]], "ocs2": [[1, 32], [16, 17]]}
    assert main(["check", str(run_dir)]) == 0


def test_a_link_over_the_loss_budget_is_refused_before_anything_runs(tmp_path, capsys):
    inventory, playbook = write(tmp_path, loss=18.5)
    assert main(["plan", str(playbook), "--inventory", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert "gpu01:p0 -> gpu02:p0: the path through ocs1 -> ocs2 loses 20.50 dB" in err
    assert "over the loss budget of 20.00 dB" in err and "Traceback" not in err
