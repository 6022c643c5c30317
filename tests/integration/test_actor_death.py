"""A device actor whose worker process dies mid-call (kill -9): Ray restarts it, the call is recorded as
`info` (its outcome is unknown), and the run goes on or stops by the playbook's `on_actor_death`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from runner_process import WAIT_S, cli, read_events, start_run, wait_for_event

PLAYBOOK = """\
name: actor-death
description: a long measurement on gpu01's actor, whose worker is killed in the first trial
trials: 2
on_actor_death: {policy}
job:
  command: [testbed-train, --steps, "1000000", --dim, "16", --step-time, "0.02", --timeout, "60"]
  ranks: [gpu01, gpu02]
steps:
  - {{action: job.start, wait_steps: 2}}
  - {{action: job.measure, rank: 0, steps: 400, measure: it}}
  - {{action: job.stop}}
"""


def run_and_kill_actor(repo: Path, tmp_path: Path, policy: str) -> tuple[int, list[dict], Path]:
    playbook = tmp_path / "actor-death.yaml"
    playbook.write_text(PLAYBOOK.format(policy=policy))
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook), "--emulate", "--results", str(results)])
    try:
        run_dir = wait_for_event(results, proc, "gpu.step_times", "invoke")
        pid = json.loads((run_dir / "run.json").read_text())["actors"]["gpu01"]["pid"]
        os.kill(pid, signal.SIGKILL)  # the actor's Ray worker, in the middle of the measurement
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, read_events(run_dir / "events.jsonl"), run_dir


def trial_ends(events: list[dict]) -> dict[int, dict]:
    return {e["trial"]: e["data"] for e in events if e["op"] == "trial.end"}


def test_restart_records_the_lost_call_as_info_and_goes_on_with_the_next_trial(repo, tmp_path):
    code, events, run_dir = run_and_kill_actor(repo, tmp_path, "restart")
    lost = [e for e in events if e["op"] == "gpu.step_times" and e["type"] == "info"]
    assert len(lost) == 1 and lost[0]["device"] == "gpu01" and lost[0]["trial"] == 0
    assert lost[0]["data"]["audit_lost"] and "outcome unknown" in lost[0]["data"]["error"]
    ends = trial_ends(events)
    assert ends[0]["status"] == "failed" and "actor of gpu01 died" in ends[0]["actor_died"]
    assert ends[1]["status"] == "ok"  # the restarted actor (a new SSH connection) ran the whole next trial
    restarted = next(e for e in events if e["op"] == "actor.restarted")
    assert restarted["device"] == "gpu01" and restarted["data"]["pid"] != restarted["data"]["was"]
    assert any(e["op"] == "it.time" and e["trial"] == 1 for e in events)
    assert code == 1  # a trial failed: the run says so
    result = cli("check", str(run_dir), cwd=repo)
    assert result.returncode == 0, result.stdout


def test_stop_ends_the_run_after_the_trial_with_teardown_and_read_back(repo, tmp_path):
    code, events, run_dir = run_and_kill_actor(repo, tmp_path, "stop")
    assert [e["type"] for e in events if e["op"] == "gpu.step_times"] == ["invoke", "info"]
    assert list(trial_ends(events)) == [0]  # no second trial
    failed = next(e for e in events if e["op"] == "run.failed")
    assert "on_actor_death: stop" in failed["data"]["error"]
    assert any(e["op"] == "fabric.final" for e in events)
    stops = [e["type"] for e in events if e["op"] == "gpu.stop_job" and e["type"] != "invoke"]
    assert stops == ["ok", "ok"]  # both ranks stopped, through the restarted actor too
    assert code == 1 and json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    result = cli("check", str(run_dir), cwd=repo)
    assert result.returncode == 0, result.stdout


DARK = """\
name: dark-wait
description: a circuit from a port nobody transmits on, so the actor waits for light that never comes
trials: 1
configurations:
  dark: {circuits: {ocs1: [[25, 41]]}}
steps:
  - {action: fabric.apply, configuration: dark, timeout_ms: 120000}
teardown:
  - {action: fabric.clear}
"""


def test_a_switch_actor_killed_after_its_commands_is_read_back_and_check_explains_it(repo, tmp_path):
    from emulators.control import TwinControl

    playbook = tmp_path / "dark.yaml"
    playbook.write_text(DARK)
    results = tmp_path / "results"
    proc = start_run(repo, [str(playbook), "--emulate", "--results", str(results)])
    try:
        run_dir = wait_for_event(results, proc, "ocs.reconfigure", "invoke")
        info = json.loads((run_dir / "run.json").read_text())
        twin = TwinControl(info["twin"]["control"])
        deadline = time.monotonic() + WAIT_S
        while [25, 41] not in twin.call("ocs1", "state")["connections"]:  # the command reached the switch
            assert time.monotonic() < deadline, "the circuit was never made"
            time.sleep(0.05)
        twin.close()
        os.kill(info["actors"]["ocs1"]["pid"], signal.SIGKILL)  # while it waits for light
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = read_events(run_dir / "events.jsonl")
    assert [e["type"] for e in events if e["op"] == "ocs.reconfigure"] == ["invoke", "info"]
    observed = next(e for e in events if e["op"] == "fabric.observed")
    assert observed["data"]["circuits"] == {"25": 41}  # sent by the dead worker, whose audit records died with it
    assert any(e["op"] == "fabric.final" for e in events)
    result = cli("check", str(run_dir), cwd=repo)
    assert result.returncode == 0, result.stdout
    assert "explained by the calls whose bytes were lost" in result.stdout

    # Strictness: the same reading without a call of unknown outcome to explain it fails the check.
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    (run_dir / "events.jsonl").write_text(
        "\n".join(line.replace('"audit_lost": true', '"audit_lost": false') for line in lines) + "\n"
    )
    result = cli("check", str(run_dir), cwd=repo)
    assert result.returncode == 1 and "differs from its history on ports [25, 41]" in result.stdout
