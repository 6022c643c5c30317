"""A failover that rewires the wrong ports fails, in the twin exactly as in a miscabled lab: the spares' p0
fibres really land on other switch ports than the fibre map says. With light checks the failover stops at
link verification; without them the relaunched job cannot communicate and makes no progress. Either way
the trial is reported as failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

# Each spare's p0 transmits into (and receives from) ports the map does not say: 21/53 and 22/54 are free.
MISCABLED = [("gpu09", 17, 49, 21, 53), ("gpu10", 19, 51, 22, 54)]  # host, map ingress/egress, real ones


PLAYBOOK = """\
name: failover-miscabled
trials: 1
job:
  command: [testbed-train, --steps, "1000000", --dim, "32", --step-time, "0.02", --checkpoint-every, "5",
            --timeout, "3"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric: {{topology: ring, port: p0, reverse_port: p1, verify_light: {verify}}}
steps:
  - {{action: job.start, wait_steps: 6}}
  - {{action: failover, fault: {{kind: gpu.fail}}, timeout_ms: 20000}}
  - {{action: job.stop}}
"""


@pytest.fixture(scope="module")
def inventory(repo, tmp_path_factory) -> Path:
    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    for host, ingress, egress, real_in, real_out in MISCABLED:
        right = f"{{host: {host}, port: p0, switch: ocs1, ingress: {ingress}, egress: {egress}}}"
        wrong = right[:-1] + f", emulation: {{ingress: {real_in}, egress: {real_out}}}}}"
        assert right in text
        text = text.replace(right, wrong)
    path = tmp_path_factory.mktemp("inv") / "miscabled.yaml"
    path.write_text(text)
    return path


def run(tmp_path: Path, inventory: Path, verify: bool, capsys) -> tuple[int, Path, str]:
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(PLAYBOOK.format(verify=str(verify).lower()))
    code = main(["run", str(playbook), "--emulate", "--inventory", str(inventory), "--results", str(tmp_path / "r")])
    out = capsys.readouterr()
    return code, Path(out.out.strip().splitlines()[-1].removeprefix("results: ")), out.err


def test_light_verification_catches_the_wrong_ports(ray_cluster, inventory, tmp_path, capsys):
    code, run_dir, err = run(tmp_path, inventory, True, capsys)
    assert code == 1
    assert "no light on" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["trials"]["failed"] == 1
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert not any(e["op"] in ("link_verified", "job_relaunched") for e in events)
    # Commit-confirm: the unverified rewiring was reverted, so the switch holds the ring it held before.
    assert "the change was reverted (commit-confirm)" in err
    assert any(e["op"] == "reverted" and e.get("device") == "ocs1" for e in events)
    before = next(e for e in events if e["op"] == "ocs.reconfigure" and e["type"] == "invoke")["data"]["circuits"]
    final = next(e for e in events if e["op"] == "fabric.final")["data"]["circuits"]["ocs1"]
    assert {int(i): e for i, e in final.items()} == dict(map(tuple, before))
    assert main(["check", str(run_dir)]) == 0  # the fault was healed, every operation closed


def test_without_light_checks_the_job_makes_no_progress_on_the_wrong_ports(ray_cluster, inventory, tmp_path, capsys):
    code, run_dir, err = run(tmp_path, inventory, False, capsys)
    assert code == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["trials"]["failed"] == 1
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ops = {e["op"] for e in events}
    assert "job_relaunched" in ops  # it did relaunch, on circuits that carry no light between the ranks
    assert "failover.resumed" not in ops and "failover.total" not in ops  # and never trained again
    info = json.loads((run_dir / "run.json").read_text())
    assert info["twin_dataplane"]["refused"] + info["twin_dataplane"]["cut"] > 0  # the fabric stopped it
