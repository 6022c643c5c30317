"""The job's fabric service in `testbed check` and `testbed heal`.

- kill -9 of `testbed run` while its ranks wait on a change the service is making: `testbed heal` stops the ranks,
  records every request the dead service never answered and the service's end, and `testbed check` passes;
- `testbed check` finds a request whose answer is missing from the history, and a circuit on the service's ports
  that none of its configurations has (both written into copies of a real run's folder).

The lab is a standalone twin (its own process, as `testbed emulate` runs it), so it outlives the runner.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from runner_process import cli, read_events, start_run, wait_for
from test_kill9 import kill9, running

from emulators.twin import TwinProcess
from testbed.cli.main import main
from testbed.documents import load_inventory, load_playbook
from testbed.plan import make_plan
from testbed.twin.bridge import point_at_twin, twin_spec

PLAYBOOK = """\
name: service-kill9
trials: 1
configurations:
  tp: {links: ["gpu01:p0 <-> gpu02:p0"]}
  dp: {links: ["gpu01:p1 <-> gpu02:p1"]}
workloads:
  card:
    phases:
      - {name: tp, configuration: tp, compute_ms: 10, bytes: 4096}
      - {name: dp, configuration: dp, compute_ms: 10, bytes: 4096}
job:
  command: [testbed-train, --timeout, "600"]
  ranks: [gpu01, gpu02]
  fabric_service: {configurations: [tp, dp]}
steps:
  - {action: rail.train, workload: card, mode: on-demand, delay_ms: 600000, iterations: 3}
"""


@pytest.fixture()
def lab(repo, tmp_path):
    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    playbook_file = tmp_path / "service.yaml"
    playbook_file.write_text(PLAYBOOK)
    plan = make_plan(load_playbook(str(playbook_file), inventory).model, inventory)
    with TwinProcess(twin_spec(inventory, 0, only=set(plan.devices))) as twin:
        pointed = point_at_twin(inventory, twin.endpoints.to_json()).model_copy(update={"emulated_only": False})
        inventory_file = tmp_path / "lab.yaml"
        inventory_file.write_text(yaml.safe_dump(pointed.model_dump(mode="json", exclude_none=True)))
        yield twin, playbook_file, inventory_file


def test_heal_records_what_a_dead_service_never_answered_and_the_run_checks(repo, tmp_path, lab):
    twin, playbook_file, inventory_file = lab
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook_file), "--inventory", str(inventory_file), "--results", str(results), "--yes"])

    def changing_to_dp(e: dict) -> bool:  # the switch moved to dp; the service now sleeps its 600 s delay
        return e["op"] == "fabric_service.request" and e["data"].get("config") == "dp" and e["data"]["rank"] == 1

    run_dir = wait_for(results, proc, changing_to_dp, "rank 1 asks for dp")
    wait_for(results, proc, lambda e: e["op"] == "sent" and e.get("device") == "ocs1", "a switch command")
    kill9(proc)
    events = read_events(run_dir / "events.jsonl")
    pids = [e["data"]["value"]["pid"] for e in events if e["op"] == "gpu.start_job" and e["type"] == "ok"]
    assert not any(e["op"] == "fabric_service.stop" for e in events)

    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "the job's fabric service died with the run: 2 request(s) recorded as never answered" in healed.stdout
    after = read_events(run_dir / "events.jsonl")[len(events) :]
    unanswered = [e["data"] for e in after if e["op"] == "fabric_service.unanswered"]
    assert sorted((u["rank"], u["op"], u["config"]) for u in unanswered) == [(0, "setup", "dp"), (1, "setup", "dp")]
    assert [e["op"] for e in after].count("fabric_service.stop") == 1
    assert ("ok", "gpu.stop_job") in {(e["type"], e["op"]) for e in after}
    assert pids and not any(running(pid) for pid in pids)  # the emulated ranks are processes of this machine
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok   every job request answered" in checked.stdout


@pytest.fixture(scope="module")
def served_run(ray_cluster, repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served")
    (tmp / "pb.yaml").write_text(PLAYBOOK.replace("delay_ms: 600000", "delay_ms: 0"))
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    assert main(["run", str(tmp / "pb.yaml"), "--emulate", "--results", str(tmp / "r"), "--inventory", inventory]) == 0
    return next((tmp / "r").iterdir())


def copy_of(run_dir, tmp_path):
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    return copy


def test_check_passes_on_the_run_and_finds_an_answer_missing_from_its_history(served_run, tmp_path, capsys):
    assert main(["check", str(served_run)]) == 0
    copy = copy_of(served_run, tmp_path)
    lines = (copy / "events.jsonl").read_text().splitlines(keepends=True)
    answer = next(
        i
        for i, line in enumerate(lines)
        if '"fabric_service.answer"' in line and json.loads(line)["data"]["op"] == "setup"
    )
    dropped = json.loads(lines[answer])["data"]
    (copy / "events.jsonl").write_text("".join(lines[:answer] + lines[answer + 1 :]))
    capsys.readouterr()
    assert main(["check", str(copy)]) != 0
    out = capsys.readouterr().out
    assert f"rank {dropped['rank']}'s setup {dropped['config']}" in out and "was never answered" in out


def test_check_finds_a_circuit_outside_the_services_configurations(served_run, tmp_path, capsys):
    copy = copy_of(served_run, tmp_path)
    events = read_events(copy / "events.jsonl")
    change = next(e for e in events if e["op"] == "fabric_service.change")
    audit = (copy / "audit.jsonl").read_text().splitlines(keepends=True)
    at = max(i for i, line in enumerate(audit) if json.loads(line)["mono_ns"] <= change["mono_ns"]) + 1
    rogue = {"device": "ocs1", "address": "x", "direction": "tx", "data": ":OXC:SWIT:CONN:ADD (@1),(@41)\n"}
    rogue |= {"mono_ns": change["mono_ns"], "wall": 0.0}  # gpu01:p0 -> gpu05:p0, in no configuration
    (copy / "audit.jsonl").write_text("".join([*audit[:at], json.dumps(rogue) + "\n", *audit[at:]]))
    capsys.readouterr()
    assert main(["check", str(copy)]) != 0
    out = capsys.readouterr().out
    assert "circuit(s) [(1, 41)] on the service's ports belong to none of its configurations" in out
