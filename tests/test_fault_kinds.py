"""Each fault kind is one definition: its toxics agree with the fault proxy's own table, and a kind a lab cannot
inject stops a real run before anything is touched, saying why."""

from __future__ import annotations

from pathlib import Path

import yaml

from emulators.proxy.toxics import SCHEMA
from testbed.cli import main
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
    code = main(["run", str(REPO / "playbooks/straggler.yaml"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert "host.straggle: a lab needs a duty-cycle agent" in err and "--emulate" in err
    assert not (tmp_path / "results").exists()  # refused before a run folder exists
