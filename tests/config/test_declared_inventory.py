"""A playbook may name the inventory it is written for (`inventory:`, relative to its file): the commands use
it when no --inventory is given, and a name that leads nowhere is reported at its line.
"""

from __future__ import annotations

from testbed.cli.main import main


def test_a_playbook_runs_its_plan_on_the_inventory_it_names(repo, capsys):
    assert main(["plan", str(repo / "playbooks/opus-failover.yaml")]) == 0
    out = capsys.readouterr().out
    assert "opus-failover on opus-2048" in out and "h[001:008], h[249:256]" in out


def test_an_explicit_inventory_wins_over_the_named_one(repo, capsys):
    rack = str(repo / "playbooks/inventory/emulated-rack.yaml")
    assert main(["plan", str(repo / "playbooks/opus-failover.yaml"), "--inventory", rack]) == 2
    assert "no GPU host named 'h008'" in capsys.readouterr().err


def test_a_named_inventory_that_is_not_there_is_reported_at_its_line(tmp_path, capsys):
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: x\n\ninventory: inventory/nope.yaml\nsteps: [{action: hosts.health}]\n")
    assert main(["plan", str(playbook)]) == 2
    err = capsys.readouterr().err
    assert f"{playbook}:3: inventory: no such file" in err and "Traceback" not in err
