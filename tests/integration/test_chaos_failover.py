"""playbooks/chaos-failover.yaml on the twin: every trial a seeded random device fault starts a failover
while a seeded random network fault hits the OCS's connection (through the twin's fault proxy). The history
is complete and consistent (`testbed check`), every fault is healed, operations whose outcome the network
hid are recorded as info, and the failover recovers by rewiring again once the connection is back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

TRIALS = 6  # with seed 7 these draw timeout, latency, slicer, down, slow_close and timeout again
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def run_dir(ray_cluster, repo, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    code = main(["run", str(repo / "playbooks/chaos-failover.yaml"), "--emulate", "--trials", str(TRIALS),
                 "--results", str(results)])  # fmt: skip
    assert code == 0
    return next(results.iterdir())


def test_the_history_is_whole_and_passes_the_checker(run_dir, capsys):
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]  # no torn line
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
    assert main(["check", str(run_dir)]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_every_network_fault_was_applied_and_healed(run_dir):
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    injected = [e for e in events if e["op"] == "fault.inject" and e["type"] == "ok" and e.get("device") == "ocs1"]
    healed = [e for e in events if e["op"] == "fault.heal" and e["type"] == "ok" and e.get("device") == "ocs1"]
    assert len(injected) == len(healed) == TRIALS
    kinds = {e["data"]["kind"] for e in injected}
    assert {"transport.timeout", "transport.down"} <= kinds
    info = json.loads((run_dir / "run.json").read_text())
    assert "tcp_direct" in info["twin"]["devices"]["ocs1"]  # the OCS was reached through the fault proxy


def test_lost_acknowledgements_are_info_and_the_failover_recovers(run_dir):
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    unknown = [e for e in events if e["type"] == "info" and e["op"] == "ocs.reconfigure"]
    assert unknown  # a stalled or refused connection hid whether the switch took the change
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == TRIALS  # every failover rewired again once the connection was back
    assert all(e["data"]["resumed_from"] > 0 for e in events if e["op"] == "failover.resumed")
