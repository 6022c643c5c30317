"""The Opus rail sweep with a real phased job (rail.train): four testbed-train ranks move real bytes over each
phase's circuits on the twin and ask the fabric service for them. What each mode does is read from what the run
recorded, in the order it happened: on-demand, every rank asks at the boundary and is answered once the change is
ready; provisioning, the change begins before the boundary and a rank waits only for what is left of it. No
wall-clock comparison: how much provisioning hides is a figure, measured by bench/rail_hiding.py. The bytes the
ranks delivered per phase are the bytes the twin's data plane carried.
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


def points(run_dir) -> dict[tuple[str, float], list[dict]]:
    """Each sweep point's events, by (mode, delay_ms): a point is a trial of its own."""
    evs = events(run_dir)
    point = {e["trial"]: (e["data"]["mode"], e["data"]["delay_ms"]) for e in evs if e["op"] == "iteration.time"}
    out: dict[tuple[str, float], list[dict]] = {}
    for e in evs:
        if e.get("trial") in point:
            out.setdefault(point[e["trial"]], []).append(e)
    return out


def setups_by_rank(evs: list[dict]) -> dict[int, list[dict]]:
    """Each rank's answered setups, in the order the service read them."""
    out: dict[int, list[dict]] = {}
    for e in evs:
        if e["op"] == "fabric_service.answer" and e["data"]["op"] == "setup":
            out.setdefault(e["data"]["rank"], []).append(e["data"])
    return {rank: sorted(s, key=lambda a: a["t_received_ns"]) for rank, s in out.items()}


def boundaries(evs: list[dict]) -> list[tuple[dict, dict[int, dict]]]:
    """Each phase boundary that changed the fabric: its change and each rank's setup at it. A rank's first setup
    is the first phase's, in place before the job; its k-th after that is the k-th change's.
    """
    changes = [e["data"] for e in evs if e["op"] == "fabric_service.change"]
    setups = setups_by_rank(evs)
    assert sorted(setups) == [0, 1, 2, 3]
    assert all(len(s) == len(changes) + 1 for s in setups.values()), {r: len(s) for r, s in setups.items()}
    out = [(c, {rank: s[k + 1] for rank, s in setups.items()}) for k, c in enumerate(changes)]
    assert all(s["config"] == c["config"] for c, at in out for s in at.values())
    return out


def waited_for_a_change(setup: dict, changes: list[dict]) -> bool:
    """Some change was under way (begun, not yet ready) while the service held this setup."""
    received, answered = setup["t_received_ns"], setup["t_answered_ns"]
    return any(c["t_received_ns"] < answered and received < c["t_ready_ns"] for c in changes)


def test_static_ranks_never_ask_the_fabric_service(rail_run):
    for (mode, _), evs in points(rail_run).items():
        if mode == "static":
            assert not [e for e in evs if e["op"].startswith("fabric_service.")]


def test_on_demand_every_rank_asks_at_the_boundary_and_waits_for_the_whole_change(rail_run):
    for (mode, delay), evs in points(rail_run).items():
        if mode != "on-demand":
            continue
        for change, at in boundaries(evs):
            assert change["trigger"] == "setup" and change["delay_ms"] == delay
            for setup in at.values():
                # the change began only once every rank had asked, at the boundary (the last request began it)
                assert setup["t_received_ns"] <= change["t_received_ns"], (delay, change, setup)
                # and each rank was answered only once the configuration was ready: it paid for all of it
                assert setup["t_answered_ns"] >= change["t_ready_ns"], (delay, change, setup)


def test_provisioning_prepares_each_change_before_the_boundary_and_waits_only_for_what_is_left(rail_run):
    for (mode, delay), evs in points(rail_run).items():
        if mode != "provisioning":
            continue
        all_changes = [e["data"] for e in evs if e["op"] == "fabric_service.change"]
        for change, at in boundaries(evs):
            # the last rank's prepare, sent as its traffic ended, began the change: behind the compute, before the
            # boundary (that rank's setup at it was read after the change began)
            assert change["trigger"] == "prepare" and change["delay_ms"] == delay
            assert change["t_received_ns"] < at[change["rank"]]["t_received_ns"], (delay, change)
            for setup in at.values():
                assert setup["t_answered_ns"] >= change["t_ready_ns"], (delay, change, setup)  # never before ready
                if setup["t_received_ns"] > change["t_ready_ns"]:
                    # the change was over before the boundary: that setup waited for no switch at all
                    assert not waited_for_a_change(setup, all_changes), (delay, change, setup)


def test_each_iterations_stall_holds_the_time_the_service_held_its_setups(rail_run):
    """The stall rank 0 records (its own clock, around its setup calls) contains the service's receive -> answer
    of those setups (one machine's monotonic clock on the twin): the wait it reports is the service's doing.
    """
    summary = json.loads((rail_run / "summary.json").read_text())
    assert len(summary["sweep"]) == 9 and all(p["spans"]["iteration.stall"]["n"] == 3 for p in summary["sweep"])
    for (mode, delay), evs in points(rail_run).items():
        if mode == "static":
            continue
        setups = setups_by_rank(evs)[0]
        stalls = [e["data"] for e in evs if e["op"] == "iteration.stall"]
        assert len(stalls) == 3
        for stall in stalls:
            # measured iteration i is the job's iteration i + 2 (one warm-up), two phases: two setups each
            held = sum(s["t_answered_ns"] - s["t_received_ns"] for s in setups[2 * stall["iteration"] + 2 :][:2])
            assert stall["ms"] >= held / 1e6 - 0.001, (mode, delay, stall, held)  # the job prints 3 decimals


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
