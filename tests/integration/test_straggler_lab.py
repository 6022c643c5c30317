"""host.straggle on a lab, end to end: `testbed run` without --emulate against a lab whose hosts are a
standalone twin's (its own process, reached over SSH like real hosts; no twin control in the run), so the
straggler is the duty-cycle agent testbed-straggle the run starts on the host (docs/faults.md).

- a run: the straggler slows the whole ring, and is healed (its agent gone, the rank running);
- SIGTERM mid-fault: the runner's own abort heals it;
- kill -9 mid-fault: the agent keeps running; `testbed heal` ends it from the run's history and continues
  the rank; `testbed check` passes on the healed run.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import yaml
from runner_process import cli, read_events, start_run, wait_for_event
from straggler_evidence import assert_the_stops_slowed_the_job, straggled_intervals

from emulators.twin import TwinProcess
from testbed.documents import load_inventory, load_playbook
from testbed.plan import make_plan
from testbed.twin.bridge import point_at_twin, twin_spec

JOB = """\
job:
  command: [testbed-train, --steps, "1000000", --dim, "64", --step-time, "0.02", --timeout, "600"]
  ranks: [gpu01, gpu02]
"""
MEASURED = f"""\
name: straggler-lab
description: a 2-rank ring with one rank stopped half of every 200 ms, on a lab
trials: 1
{JOB}
steps:
  - {{action: job.start, wait_steps: 3}}
  - {{action: job.measure, steps: 20, measure: baseline}}
  - action: parallel
    steps:
      - {{action: fault.inject, fault: {{kind: host.straggle, target: "rank:1", duty: 0.5, period_ms: 200}},
         duration_ms: 3000}}
      - {{action: job.measure, steps: 30, measure: straggled}}
  - {{action: job.stop}}
"""
HELD = f"""\
name: straggler-held
description: a straggler held for ten minutes, for a runner to die in the middle of
trials: 1
{JOB}
steps:
  - {{action: job.start, wait_steps: 2}}
  - {{action: fault.inject, fault: {{kind: host.straggle, target: "rank:1", duty: 0.5, period_ms: 200}},
     duration_ms: 600000}}
  - {{action: job.stop}}
"""


@pytest.fixture()
def lab(repo, tmp_path):
    """A standalone twin of the two hosts, and a lab inventory (emulated_only: false) pointing at it."""
    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    for name, text in (("measured.yaml", MEASURED), ("held.yaml", HELD)):
        (tmp_path / name).write_text(text)
    plan = make_plan(load_playbook(str(tmp_path / "held.yaml"), inventory).model, inventory)
    with TwinProcess(twin_spec(inventory, 0, only=set(plan.devices))) as twin:
        pointed = point_at_twin(inventory, twin.endpoints.to_json()).model_copy(update={"emulated_only": False})
        inventory_file = tmp_path / "lab.yaml"
        inventory_file.write_text(yaml.safe_dump(pointed.model_dump(mode="json", exclude_none=True)))
        yield twin, inventory_file


def agents(twin: TwinProcess, host: str) -> list[dict]:
    """The straggler agents the host runs, as its twin control reports them."""
    return [j for j in twin.control.call(host, "state")["jobs"] if j["argv"][0] == "testbed-straggle" and j["alive"]]


def ops(events: list[dict], *names: str) -> list[tuple[str, str]]:
    return [(e["type"], e["op"]) for e in events if e["op"] in names and e["type"] != "mark"]


def test_a_straggler_on_a_lab_slows_the_ring_and_is_healed(repo, tmp_path, lab):
    twin, inventory_file = lab
    args = [str(tmp_path / "measured.yaml"), "--inventory", str(inventory_file), "--results", str(tmp_path / "r")]
    run = cli("run", *args, "--yes", cwd=repo)
    assert run.returncode == 0, run.stdout + run.stderr
    run_dir = next((tmp_path / "r").iterdir())
    spans = json.loads((run_dir / "summary.json").read_text())["spans"]
    assert {"baseline.time", "straggled.time"} <= set(spans)
    assert_the_stops_slowed_the_job(straggled_intervals(run_dir), duty=0.5, period_ms=200)

    events = read_events(run_dir / "events.jsonl")
    assert ops(events, "fault.inject", "fault.heal", "gpu.straggle_start", "gpu.straggle_stop") == [
        ("invoke", "fault.inject"),
        ("invoke", "gpu.straggle_start"),
        ("ok", "gpu.straggle_start"),
        ("ok", "fault.inject"),
        ("invoke", "fault.heal"),
        ("invoke", "gpu.straggle_stop"),
        ("ok", "gpu.straggle_stop"),
        ("ok", "fault.heal"),
    ]
    started = next(e for e in events if e["op"] == "gpu.straggle_start" and e["type"] == "ok")["data"]["value"]
    stopped = next(e for e in events if e["op"] == "gpu.straggle_stop" and e["type"] == "ok")["data"]["value"]
    assert stopped["agents"] == [{"pid": started["agent"], "result": "terminated"}] and not stopped["left_stopped"]
    # The injection moment is the host's mark (the agent's start line), described by the engine.
    marks = [e for e in events if e["op"] == "fault_injected" and e["device"] == "gpu02"]
    described = next(e for e in events if e["op"] == "fault_described")
    assert (
        marks
        and described["data"]["kind"] == "host.straggle"
        and described["data"]["injected_ns"] == marks[0]["mono_ns"]
    )
    assert agents(twin, "gpu02") == []
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_sigterm_mid_straggle_heals_it_on_a_lab(repo, tmp_path, lab):
    twin, inventory_file = lab
    results = tmp_path / "results"
    proc = start_run(
        repo, [str(tmp_path / "held.yaml"), "--inventory", str(inventory_file), "--results", str(results), "--yes"]
    )
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    assert len(agents(twin, "gpu02")) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 1, proc.stderr.read()
    events = read_events(run_dir / "events.jsonl")
    assert ops(events, "fault.heal", "gpu.straggle_stop") == [
        ("invoke", "fault.heal"),
        ("invoke", "gpu.straggle_stop"),
        ("ok", "gpu.straggle_stop"),
        ("ok", "fault.heal"),
    ]
    assert agents(twin, "gpu02") == []
    assert "nothing to heal" in cli("heal", str(run_dir), cwd=repo).stdout


def test_kill9_mid_straggle_then_heal_ends_the_agent_and_check_passes(repo, tmp_path, lab):
    twin, inventory_file = lab
    results = tmp_path / "results"
    proc = start_run(
        repo, [str(tmp_path / "held.yaml"), "--inventory", str(inventory_file), "--results", str(results), "--yes"]
    )
    run_dir = wait_for_event(results, proc, "fault.inject", "ok")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    events = read_events(run_dir / "events.jsonl")
    started = next(e for e in events if e["op"] == "gpu.straggle_start" and e["type"] == "ok")["data"]["value"]
    (agent,) = agents(twin, "gpu02")  # the runner is gone; the agent on the host is not
    assert agent["pid"] == started["agent"]

    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert (
        f"fault host.straggle@rank1: straggler agents on gpu02: {agent['pid']} terminated "
        f"(the run's agent {agent['pid']}: terminated); SIGCONT to pid {started['pid']}'s process group"
    ) in healed.stdout
    assert agents(twin, "gpu02") == []
    after = read_events(run_dir / "events.jsonl")[len(events) :]
    heal_ops = [(e["type"], e["op"], e.get("device")) for e in after]
    assert ("ok", "gpu.straggle_stop", "gpu02") in heal_ops and ("ok", "fault.heal", "gpu02") in heal_ops
    # straggle stopped before the ranks: every rank then stopped, none left alive
    assert heal_ops.index(("ok", "gpu.straggle_stop", "gpu02")) < heal_ops.index(("ok", "gpu.stop_job", "gpu02"))
    for host in ("gpu01", "gpu02"):
        assert not any(j["alive"] for j in twin.control.call(host, "state")["jobs"])
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "nothing to heal" in cli("heal", str(run_dir), cwd=repo).stdout
