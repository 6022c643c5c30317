"""The Opus rail sweep with a real phased job (rail.train): four testbed-train ranks move real bytes over each
phase's circuits on the twin and ask the fabric service for them. Provisioning hides a delay that fits in a
phase's compute, on-demand pays for every change, a delay longer than the compute stalls both; the bytes the
ranks delivered per phase are the bytes the twin's data plane carried. Lower bounds only (each follows from the
switching time and the delays), so a busy machine cannot make the test pass wrongly.
"""

from __future__ import annotations

import json

import pytest

from testbed.cli.main import main

PLAYBOOK = """\
name: rail-train-small
trials: 1
configurations:
  tp: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]}
  dp: {links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]}
  rails: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0", "gpu01:p1 <-> gpu03:p1", "gpu02:p1 <-> gpu04:p1"]}
workloads:
  card:
    phases:
      - {name: tp, configuration: tp, compute_ms: 60, bytes: 65536}
      - {name: dp, configuration: dp, compute_ms: 40, bytes: 262144}
    static: rails
job:
  command: [testbed-train, --timeout, "20"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric_service: {configurations: [tp, dp]}
sweep:
  mode: [static, on-demand, provisioning]
  delay_ms: [0, 20, 200]
steps:
  - {action: rail.train, workload: card, mode: "${mode}", delay_ms: "${delay_ms}", iterations: 3}
"""
SWITCHING_MS = 25  # the emulated rack's OCS
COMPUTE_MS = 60 + 40
MESSAGE = 20  # hostside/phased.py's header


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def rail_run(ray_cluster, repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rail-train")
    (tmp / "rail.yaml").write_text(PLAYBOOK)
    code = main(
        ["run", str(tmp / "rail.yaml"), "--emulate", "--results", str(tmp / "r"),
         "--inventory", str(repo / "playbooks/inventory/emulated-rack.yaml")]
    )  # fmt: skip
    assert code == 0
    return next((tmp / "r").iterdir())


def test_provisioning_hides_small_delays_and_on_demand_pays_for_every_change(rail_run):
    summary = json.loads((rail_run / "summary.json").read_text())
    t = {(p["point"]["mode"], p["point"]["delay_ms"]): p["spans"]["iteration.time"]["p50_ms"] for p in summary["sweep"]}
    assert len(t) == 9 and all(p["spans"]["iteration.time"]["n"] == 3 for p in summary["sweep"])
    for delay in (0, 20, 200):
        assert t[("static", delay)] >= COMPUTE_MS  # no controller: compute and traffic only
        # on-demand waits for both changes of every iteration: switch time plus the delay, each
        assert t[("on-demand", delay)] >= COMPUTE_MS + 2 * (SWITCHING_MS + delay)
    # A 20 ms delay fits in the compute windows (60 and 40 ms): provisioning hides it, on-demand cannot.
    assert t[("provisioning", 20)] < t[("on-demand", 20)] - 2 * SWITCHING_MS
    # 200 ms does not fit: provisioning stalls for what each change overruns its window.
    assert t[("provisioning", 200)] >= COMPUTE_MS + (SWITCHING_MS + 200 - 60) + (SWITCHING_MS + 200 - 40)


def test_the_ranks_ask_and_the_service_changes_once_per_boundary(rail_run):
    evs = events(rail_run)
    changes = [e["data"] for e in evs if e["op"] == "fabric_service.change"]
    # on-demand and provisioning: 3 sweep points x 4 iterations (warm-up included) x 2 phase boundaries each,
    # less the first (the rails the first phase needs are in place before the job), in each mode.
    assert len(changes) == 2 * 3 * (4 * 2 - 1), len(changes)
    assert all("error" not in c and c["t_sent_ns"] <= c["t_verified_ns"] <= c["t_ready_ns"] for c in changes)
    assert {c["trigger"] for c in changes} == {"setup", "prepare"}  # on-demand sets up, provisioning prepares
    answers = [e["data"] for e in evs if e["op"] == "fabric_service.answer" and e["data"]["op"] in ("setup", "prepare")]
    assert answers and all(a["ok"] for a in answers)
    spans = {e["op"] for e in evs if e["type"] == "measure"}
    assert {"fabric_service.command_time", "fabric_service.answer_time", "iteration.stall"} <= spans


def test_the_bytes_each_phase_delivered_are_the_bytes_the_data_plane_carried(rail_run):
    counted = [e["data"] for e in evs_of(rail_run, "rail.bytes")]
    assert len(counted) == 9 * 2  # every sweep point, both phases
    for c in counted:
        payload = 65536 if c["phase"] == "tp" else 262144
        assert c["job_bytes"] == 4 * 4 * (payload + MESSAGE)  # 4 ranks x 4 iterations, one partner each
        assert c["plane_bytes"] == c["job_bytes"], c


def evs_of(run_dir, op: str) -> list[dict]:
    return [e for e in events(run_dir) if e["op"] == op]


def test_the_run_checks_and_reports_its_figure_and_the_frameworks_share(rail_run, capsys, monkeypatch):
    assert main(["check", str(rail_run)]) == 0
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["report", str(rail_run)]) == 0
    assert (rail_run / "sweep_iteration_time.png").is_file()
    out = capsys.readouterr().out
    assert "the framework's share of each fabric-service change (p50)" in out
    # one row per sweep point that made changes: on-demand and provisioning, three delays each
    rows = [line for line in out.splitlines() if "mode=on-demand" in line or "mode=provisioning" in line]
    assert len([r for r in rows if " %" in r]) == 6


def test_plan_shows_the_job_the_routes_and_the_changes(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per plan item
    (tmp_path / "rail.yaml").write_text(PLAYBOOK)
    assert (
        main(["plan", str(tmp_path / "rail.yaml"), "--inventory", str(repo / "playbooks/inventory/emulated-rack.yaml")])
        == 0
    )
    out = capsys.readouterr().out
    assert "start the job: 4 ranks on gpu01, gpu02, gpu03, gpu04: testbed-train --timeout 20 (testbed-train's" in out
    assert "traffic: gpu01->gpu02 gpu02->gpu01 gpu03->gpu04 gpu04->gpu03" in out
    assert "a change starts once all 4 ranks asked, +20 ms per change" in out
    assert "static: the ranks never ask" in out


def test_a_phase_the_service_does_not_serve_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "rail.yaml").write_text(PLAYBOOK.replace("configurations: [tp, dp]", "configurations: [tp]"))
    code = main(["validate", str(tmp_path / "rail.yaml")])
    out = capsys.readouterr()
    assert code != 0
    said = out.out + out.err
    assert "rail.yaml:" in said and "the ranks ask the job's fabric service for dp" in said, said
