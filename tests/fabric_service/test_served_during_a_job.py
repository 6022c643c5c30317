"""The fabric service served during a job (issue 18, part 2): an emulated run whose two training ranks ask
for tp, dp, a configuration the playbook does not allow, then tp again and so on until stopped, every five steps
(testbed-train --fabric-phases); the coordinator applies what they ask for on the twin's switches, once per phase
however many ranks ask, refuses the rest, and records every request and answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

INVENTORY = "playbooks/inventory/emulated-rack.yaml"

PLAYBOOK = """
name: fabric-service-job
trials: 1
configurations:
  tp:
    links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]
  dp:
    links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]
job:
  command: [testbed-train, --steps, "1000000", --step-time, "0.02", --timeout, "30",
            --fabric-phases, "tp,dp,NOT_ALLOWED", --fabric-every, "5"]
  ranks: [gpu01, gpu02]
  fabric_service: {configurations: [tp, dp]}
steps:
  - {action: job.start, wait_steps: 16, timeout_ms: 60000}
  - {action: job.stop}
"""


@pytest.fixture(scope="module")
def served_run(ray_cluster, repo, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("served")
    playbook = tmp / "fabric-service-job.yaml"
    playbook.write_text(PLAYBOOK)
    results = tmp / "results"
    code = main(["run", str(playbook), "--emulate", "--results", str(results), "--inventory", str(repo / INVENTORY)])
    assert code == 0
    return next(results.iterdir())


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_the_ranks_requests_are_answered_applied_once_per_phase_and_refused_outside_the_list(served_run):
    evs = events(served_run)
    answers = [e["data"] for e in evs if e["op"] == "fabric_service.answer" and e["data"]["op"] == "setup"]
    # Each rank asks at steps 1, 6, 11, 16, 21, ...: tp, dp, (refused), tp, dp, ... until job.stop reaches it,
    # which a busy machine can let run past step 16: the phases are read from what the run recorded.
    cycle = ("tp", "dp", "NOT_ALLOWED")
    asked = {rank: [a for a in answers if a["rank"] == rank] for rank in (0, 1)}
    for mine in asked.values():
        assert len(mine) >= 4 and [a["config"] for a in mine] == [cycle[i % 3] for i in range(len(mine))]
    both = min(len(mine) for mine in asked.values())  # the phases every rank asked for
    for mine in asked.values():
        for a in mine[:both]:
            if a["config"] == "NOT_ALLOWED":
                assert a["ok"] is False and a["kind"] == "refused" and "dp, tp" in a["error"]
            else:
                assert a["ok"], a
    # One change per phase every rank asked for, however many ranks asked; none for the refused one.
    expected = [cycle[i % 3] for i in range(both) if cycle[i % 3] != "NOT_ALLOWED"]
    changes = [e["data"]["config"] for e in evs if e["op"] == "fabric_service.change"]
    assert changes == expected
    applied = [e for e in evs if e["type"] == "ok" and str(e.get("step", "")).startswith("fabric service: ")]
    per_switch: dict[tuple[str, str], int] = {}
    for e in applied:
        key = (e["device"], e["step"])
        per_switch[key] = per_switch.get(key, 0) + 1
    assert per_switch == {("ocs1", f"fabric service: {c}"): expected.count(c) for c in ("tp", "dp")}
    assert not any(e["op"] == "reconfigure" and "NOT_ALLOWED" in str(e.get("step")) for e in evs)
    connects = [e for e in evs if e["op"] == "fabric_service.connect"]
    disconnects = [e for e in evs if e["op"] == "fabric_service.disconnect"]
    assert len(connects) == 2 and len(disconnects) == 2
    starts = [e["data"]["env"] for e in evs if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
    assert len(starts) == 2 and all(env["TESTBED_FABRIC_SERVICE"].startswith("127.0.0.1:") for env in starts)
    assert all(len(env["TESTBED_FABRIC_TOKEN"]) != 32 for env in starts)  # the token itself is never recorded


def test_the_run_checks(served_run):
    assert main(["check", str(served_run)]) == 0


def test_the_plan_shows_what_the_job_may_ask_for(repo, tmp_path, capsys):
    playbook = tmp_path / "ok.yaml"
    playbook.write_text(PLAYBOOK)
    assert main(["plan", str(playbook), "--inventory", str(repo / INVENTORY)]) == 0
    out = capsys.readouterr().out
    assert "fabric service: the ranks may ask for tp, dp" in out
    assert "ocs1: 4 circuits: 1>35 3>33 5>39 7>37" in out


def test_a_configuration_the_playbook_lacks_is_refused_at_its_line(repo, tmp_path, capsys):
    playbook = tmp_path / "bad.yaml"
    playbook.write_text(PLAYBOOK.replace("configurations: [tp, dp]}", "configurations: [tp, ring]}"))
    assert main(["plan", str(playbook), "--inventory", str(repo / INVENTORY)]) != 0
    err = capsys.readouterr().err
    assert f"{playbook}:13: job.fabric_service.configurations[1]: no configuration named 'ring'" in err
