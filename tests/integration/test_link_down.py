"""link.down end to end: a playbook run in the twin injects and heals it through the switch's own commands and
`testbed check` passes the run; the twin's ground truth agrees with what the run recorded; a runner killed
with the link down leaves the ports disabled, and `testbed heal` enables them again.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from runner_process import cli, read_events, start_run, wait_for_event

from emulators.twin import TwinProcess
from testbed.cli.main import main
from testbed.documents import load_inventory, load_playbook
from testbed.ops.check import check_run
from testbed.plan import make_plan
from testbed.results.accuracy import TRUTH_FILE
from testbed.twin.bridge import point_at_twin, twin_spec

PLAYBOOK = """\
name: link-down
trials: 1
configurations:
  pair: {links: ["gpu01:p0 <-> gpu02:p0"]}
steps:
  - {action: fabric.apply, configuration: pair}
  - {action: fault.inject, fault: {kind: link.down, link: gpu01:p0}, duration_ms: 200}
  - {action: fault.inject, fault: {kind: link.down, device: ocs1, ports: [3, 35]}, duration_ms: 200}
"""
# For the kill: the link stays down far longer than the runner lives.
LONG = """\
name: link-down-long
trials: 1
configurations:
  pair: {links: ["gpu01:p0 <-> gpu02:p0"]}
steps:
  - {action: fabric.apply, configuration: pair}
  - {action: fault.inject, fault: {kind: link.down, link: gpu01:p0}, duration_ms: 600000}
"""
PAIR = {1: 35, 3: 33}  # gpu01:p0 -> gpu02:p0 and back: ingress 1 -> egress 35, ingress 3 -> egress 33


def test_a_link_down_run_in_the_twin_passes_check_and_matches_the_ground_truth(ray_cluster, repo, tmp_path):
    (tmp_path / "pb.yaml").write_text(PLAYBOOK)
    results = tmp_path / "results"
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    argv = ["run", str(tmp_path / "pb.yaml"), "--emulate", "--inventory", inventory, "--results", str(results)]
    assert main(argv) == 0
    run_dir = next(results.iterdir())
    assert check_run(run_dir).ok
    assert main(["check", str(run_dir)]) == 0

    events = read_events(run_dir / "events.jsonl")
    faults = [(e["type"], e["data"]["fault"]) for e in events if e["op"] in ("fault.inject", "fault.heal")]
    assert faults == [
        ("invoke", "link.down@gpu01:p0"),
        ("ok", "link.down@gpu01:p0"),
        ("invoke", "link.down@gpu01:p0"),
        ("ok", "link.down@gpu01:p0"),
        ("invoke", "link.down@ocs1:3,35"),
        ("ok", "link.down@ocs1:3,35"),
        ("invoke", "link.down@ocs1:3,35"),
        ("ok", "link.down@ocs1:3,35"),
    ]
    inject = next(e for e in events if e["op"] == "fault.inject" and e["type"] == "ok")
    assert inject["device"] == "ocs1" and inject["data"]["ports"] == [1, 33] and inject["data"]["link"] == "gpu01:p0"
    final = next(e for e in events if e["op"] == "fabric.final")["data"]["circuits"]["ocs1"]
    assert {int(i): e for i, e in final.items()} == PAIR  # the circuits were kept through the faults

    # The injection moment is the switch actor's mark, inside the disable call; the twin's ground truth says
    # when the switch applied it: between the command going out and the switch's answer to what followed it.
    described = [e for e in events if e["op"] == "fault_described"]
    calls = [e for e in events if e["op"] == "ocs.disable_ports" and e["type"] in ("invoke", "ok")]
    assert len(described) == 2 and len(calls) == 4
    for mark, (invoke, done) in zip(described, zip(calls[::2], calls[1::2], strict=True), strict=True):
        assert invoke["mono_ns"] <= mark["data"]["injected_ns"] <= done["mono_ns"]
    truth = [json.loads(line) for line in (run_dir / TRUTH_FILE).read_text().splitlines()]
    ports = [(t["ports"], t["state"]) for t in truth if t["event"] == "port"]
    assert ports == [([1, 33], "disabled"), ([1, 33], "enabled"), ([3, 35], "disabled"), ([3, 35], "enabled")]
    audit = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    for t in (t for t in truth if t["event"] == "port" and t["state"] == "disabled"):
        command = f":OXC:SWIT:PORT:DIS (@{','.join(map(str, t['ports']))})\n"
        k = next(k for k, a in enumerate(audit) if a["direction"] == "tx" and a["data"] == command)
        answer = next(a for a in audit[k:] if a["direction"] == "rx")
        assert audit[k]["mono_ns"] <= t["t_ns"] <= answer["mono_ns"]


@pytest.fixture()
def lab(repo, tmp_path):
    """A standalone twin of the playbook's switch (a lab that outlives its runner), and an inventory file
    pointing at it.
    """
    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    playbook_file = tmp_path / "link.yaml"
    playbook_file.write_text(LONG)
    plan = make_plan(load_playbook(str(playbook_file), inventory).model, inventory)
    with TwinProcess(twin_spec(inventory, 0, only=set(plan.devices))) as twin:
        pointed = point_at_twin(inventory, twin.endpoints.to_json()).model_copy(update={"emulated_only": False})
        inventory_file = tmp_path / "lab.yaml"
        inventory_file.write_text(yaml.safe_dump(pointed.model_dump(mode="json", exclude_none=True)))
        yield twin, playbook_file, inventory_file


def port_states(twin: TwinProcess, ports: list[int]) -> dict[int, str]:
    states = twin.control.call("ocs1", "state")["port_states"]
    return {p: states[str(p)] for p in ports}


def test_kill9_with_the_link_down_then_heal_enables_the_ports_and_check_passes(repo, tmp_path, lab):
    twin, playbook_file, inventory_file = lab
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--inventory", str(inventory_file), "--results", str(results), "--yes"])
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    assert port_states(twin, [1, 33]) == {1: "D", 33: "D"}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert port_states(twin, [1, 33]) == {1: "D", 33: "D"}  # the runner died with the link down

    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "fault link.down@gpu01:p0: enabled port(s) [1, 33] of ocs1" in " ".join(healed.stdout.split())
    assert port_states(twin, [1, 33]) == {1: "E", 33: "E"}
    after = read_events(run_dir / "events.jsonl")
    assert [(e["type"], e["op"]) for e in after if e["op"] in ("ocs.enable_ports", "fault.heal")] == [
        ("invoke", "fault.heal"),
        ("invoke", "ocs.enable_ports"),
        ("ok", "ocs.enable_ports"),
        ("ok", "fault.heal"),
    ]
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads((Path(run_dir) / "run.json").read_text())["healed"]["ok"]
