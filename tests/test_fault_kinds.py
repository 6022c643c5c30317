"""Each fault kind is one definition: its toxics agree with the fault proxy's own table, and a kind a lab cannot
inject stops a real run before anything is touched, saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from emulators.proxy.toxics import SCHEMA
from testbed.cli.main import main
from testbed.faults import FAULT_KINDS
from testbed.faults.transport import TOXICS

REPO = Path(__file__).resolve().parent.parent


def test_the_transport_kinds_name_the_proxys_toxics_and_attributes():
    assert {k: set(v) for k, v in TOXICS.items()} == {k: set(v) for k, v in SCHEMA.items()}
    transport = {k.name for k in FAULT_KINDS if k.target == "connection"}
    assert transport == {f"transport.{t}" for t in SCHEMA} | {"transport.down"}


def test_a_fault_a_lab_cannot_inject_refuses_the_real_run_up_front(tmp_path, capsys):
    lab = yaml.safe_load((REPO / "playbooks/inventory/emulated-rack.yaml").read_text())
    lab["emulated_only"] = False  # as a real lab's inventory would be
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    argv = ["--inventory", str(tmp_path / "lab.yaml"), "--results", str(tmp_path / "results"), "--yes"]
    code = main(["run", str(REPO / "playbooks/chaos-failover.yaml"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert "transport.latency, transport.reset_peer" in err and "the inventory gives ocs1 none" in err
    assert 'add fault_proxy: {api: "http://HOST:8474", proxy: NAME} to ocs1' in err and "--emulate" in err
    assert not (tmp_path / "results").exists()  # refused before a run folder exists


def test_host_straggle_runs_on_a_lab_through_the_hosts_agent(tmp_path):
    """A lab makes a straggler with testbed-straggle on the host (testbed/faults/straggle.py): no refusal."""
    from testbed.documents import load_inventory, load_playbook
    from testbed.lab import refuse_on_a_lab
    from testbed.plan import make_plan

    assert FAULT_KINDS.get("host.straggle").lab_support is None
    lab = yaml.safe_load((REPO / "playbooks/inventory/emulated-rack.yaml").read_text())
    lab["emulated_only"] = False
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    inventory = load_inventory(tmp_path / "lab.yaml").model
    plan = make_plan(load_playbook(REPO / "playbooks/straggler.yaml", inventory).model, inventory)
    refuse_on_a_lab(plan, str(tmp_path / "lab.yaml"), confirmed=True)  # raises UserError on a refusal


LINK_DOWN = """\
name: link-down
trials: 1
configurations:
  pair: {links: ["gpu01:p0 <-> gpu02:p0"]}
steps:
  - {action: fabric.apply, configuration: pair}
  - {action: fault.inject, fault: {kind: link.down, link: gpu01:p0}, when_ms: 50, duration_ms: 300}
  - {action: fault.inject, fault: {kind: link.down, device: ocs1, ports: [3, 35]}}
"""


def test_link_down_is_planned_on_its_switch_ports_and_a_lab_may_run_it(tmp_path, capsys, monkeypatch):
    from testbed.documents import load_inventory, load_playbook
    from testbed.lab import refuse_on_a_lab
    from testbed.plan import make_plan

    (tmp_path / "link.yaml").write_text(LINK_DOWN)
    inventory_file = str(REPO / "playbooks/inventory/emulated-rack.yaml")
    monkeypatch.setenv("COLUMNS", "300")  # the plan view's lines unwrapped
    assert main(["plan", str(tmp_path / "link.yaml"), "--inventory", inventory_file]) == 0
    out = capsys.readouterr().out
    assert "after 50 ms: link.down on gpu01:p0: ocs1 ports 1, 33 disabled, for 300 ms, then heal" in out
    assert "link.down: ocs1 ports 3, 35 disabled, for 1000 ms, then heal" in out
    assert "ocs1: ocs via polatis-scpi" in out and "(writes)" in out  # a write: the run locks and confirms it

    kind = FAULT_KINDS.get("link.down")
    assert kind.target == "ports" and kind.lab_support is None  # the switch's own commands: a lab can
    lab = yaml.safe_load(Path(inventory_file).read_text())
    lab["emulated_only"] = False
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    inventory = load_inventory(str(tmp_path / "lab.yaml")).model
    plan = make_plan(load_playbook(str(tmp_path / "link.yaml"), inventory).model, inventory)
    refuse_on_a_lab(plan, str(tmp_path / "lab.yaml"), confirmed=True)  # not refused up front
    steps = [s for s in plan.all_steps() if getattr(s, "kind", None) == "link.down"]
    assert [(s.ports.device, s.ports.ports, s.ports.link) for s in steps] == [
        ("ocs1", (1, 33), "gpu01:p0"),
        ("ocs1", (3, 35), None),
    ]
    assert [s.ports.disable for s in steps] == ["ocs.disable_ports"] * 2  # the switch family's procedures


@pytest.mark.parametrize(
    ("fault", "edit", "message"),
    [
        ("{kind: link.down, device: ocs1, ports: [5, 31]}", {}, "would disable port(s) [31] of ocs1"),
        ("{kind: link.down, link: gpu01:p0}", {"reserved_ports": [33]}, "would disable port(s) [33] of ocs1"),
        ("{kind: link.down, link: gpu01:p0}", {"read_only": True}, "ocs1 is read-only in the inventory"),
    ],
)
def test_the_planner_refuses_a_link_down_the_interlocks_forbid(tmp_path, capsys, fault, edit, message):
    lab = yaml.safe_load((REPO / "playbooks/inventory/emulated-rack.yaml").read_text())
    lab["devices"]["ocs1"].update(edit)
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    (tmp_path / "pb.yaml").write_text(
        f"name: refused\ntrials: 1\nsteps:\n  - {{action: fault.inject, fault: {fault}, duration_ms: 10}}\n"
    )
    assert main(["plan", str(tmp_path / "pb.yaml"), "--inventory", str(tmp_path / "lab.yaml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "interlock" in err and message in err
