"""The PCCL-style collective sweep (collective.allreduce) run for real on the twin: four ranks all-reduce 4 KiB and
1 MiB over a duplex ring on the OCS that never changes, and by recursive doubling with the topology reconfigured
per stage on the OCS and on the photonic chip. Every rank checks its sums (the step fails unless all agree);
recursive doubling on the OCS pays every stage's switch (a lower bound from the switching time); the report gives
the sizes x cases table with the crossovers and the figure; the run checks; the plan shows each stage.
"""

from __future__ import annotations

import json
import re

import pytest

from testbed.cli.main import main
from testbed.results.collective_view import collective_data, crossover

PLAYBOOK = """\
name: collective-small
trials: 1
configurations:
  ring: {links: ["gpu01:p0 <-> gpu02:p1", "gpu02:p0 <-> gpu03:p1", "gpu03:p0 <-> gpu04:p1", "gpu04:p0 <-> gpu01:p1"]}
  rd0: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]}
  rd1: {links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]}
  rd0-chip: {links: ["gpu01:p2 <-> gpu02:p2", "gpu03:p2 <-> gpu04:p2"]}
  rd1-chip: {links: ["gpu01:p2 <-> gpu03:p2", "gpu02:p2 <-> gpu04:p2"]}
job:
  command: [testbed-train, --timeout, "60"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric_service:
    configurations: [ring, rd0, rd1, rd0-chip, rd1-chip]
    min_power_dbm: -10
sweep:
  case: [ring-ocs, rd-ocs, rd-chip]
  size: [4096, 1048576]
setup:
  - {action: device.calibrate, device: chip1}
steps:
  - action: collective.allreduce
    case: "${case}"
    cases:
      ring-ocs: {algorithm: ring, fabric: ocs, configurations: [ring]}
      rd-ocs: {algorithm: rd, fabric: ocs, configurations: [rd0, rd1]}
      rd-chip: {algorithm: rd, fabric: chip, configurations: [rd0-chip, rd1-chip]}
    sizes: "${size}"
    repetitions: 2
"""
INVENTORY = "playbooks/inventory/emulated-rack.yaml"
SWITCHING_MS = 25 - 0.5  # the emulated rack's OCS, less its jitter
STAGES = 2  # log2 of 4 ranks


def events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def collective_run(ray_cluster, repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collective")
    (tmp / "c.yaml").write_text(PLAYBOOK)
    code = main(
        ["run", str(tmp / "c.yaml"), "--emulate", "--results", str(tmp / "r"), "--inventory", str(repo / INVENTORY)]
    )
    assert code == 0  # every rank of every job printed its `done` line with the same checksum, or the step failed
    return next((tmp / "r").iterdir())


def test_every_case_and_size_is_measured(collective_run):
    measured = [e["data"] for e in events(collective_run) if e["op"] == "collective.time"]
    points = {(d["case"], d["algorithm"], d["fabric"], d["size_bytes"]) for d in measured}
    cases = {("ring-ocs", "ring", "ocs"), ("rd-ocs", "rd", "ocs"), ("rd-chip", "rd", "chip")}
    assert points == {(*c, size) for c in cases for size in (4096, 1048576)}
    assert len(measured) == 3 * 2 * 2  # cases x sizes x repetitions (the warm-up is not measured)
    assert all(d["ms"] > 0 and 0 <= d["rank"] < 4 for d in measured)


def test_recursive_doubling_on_the_ocs_pays_every_stage_switch(collective_run):
    measured = [e["data"] for e in events(collective_run) if e["op"] == "collective.time"]
    for d in measured:
        if d["case"] == "rd-ocs":  # each all-reduce starts on the last stage's matching: every stage changes
            assert d["reconfig_ms"] >= STAGES * SWITCHING_MS, d
            assert d["ms"] >= STAGES * SWITCHING_MS, d
        if d["algorithm"] == "ring":
            assert d["reconfig_ms"] == 0, d  # the ring never asks
    changes = [e["data"] for e in events(collective_run) if e["op"] == "fabric_service.change"]
    # per recursive-doubling sweep point: (1 warm-up + 2 measured) all-reduces x 2 stages, each a change
    assert len(changes) == 2 * 2 * 3 * STAGES, len(changes)
    assert all("error" not in c and c["t_sent_ns"] <= c["t_verified_ns"] <= c["t_ready_ns"] for c in changes)
    assert {c["config"] for c in changes} == {"rd0", "rd1", "rd0-chip", "rd1-chip"}


def test_the_run_checks_and_reports_the_crossover_table_and_the_figure(collective_run, capsys, monkeypatch):
    assert main(["check", str(collective_run)]) == 0
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["report", str(collective_run)]) == 0
    out = capsys.readouterr().out
    assert (collective_run / "collective_time.png").is_file()
    assert "all-reduce p50 ms per message size" in out
    sizes, cases = collective_data(collective_run)
    assert sizes == [4096, 1048576] and list(cases) == ["ring-ocs", "rd-ocs", "rd-chip"]
    for name in ("rd-ocs", "rd-chip"):  # the crossover printed is the one these very numbers give
        at = crossover(cases["ring-ocs"], cases[name])
        shown = "none" if at is None else {4096: "4 KiB", 1048576: "1 MiB"}[at]
        fabric = cases[name].fabric
        assert re.search(rf"│ {name} +│ {fabric} +│ ring-ocs +│ {shown} +│", out), out
    assert "command -> light (switches)" in out and "rd-chip (chip)" in out
    rows = [line for line in out.splitlines() if line.startswith(("│ 4 KiB", "│ 1 MiB"))]
    assert len(rows) == 2


def test_plan_shows_each_stage_and_its_configuration(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    (tmp_path / "c.yaml").write_text(PLAYBOOK)
    assert main(["plan", str(tmp_path / "c.yaml"), "--inventory", str(repo / INVENTORY)]) == 0
    out = capsys.readouterr().out
    assert "before the job: configuration ring" in out and "before the job: configuration rd1-chip" in out
    assert "stage 0: configuration rd0; traffic: gpu01->gpu02 gpu02->gpu01 gpu03->gpu04 gpu04->gpu03" in out
    assert "stage 1: configuration rd1-chip; traffic: gpu01->gpu03 gpu02->gpu04 gpu03->gpu01 gpu04->gpu02" in out
    assert "ring: reduce-scatter + all-gather, 6 steps each sending 1/4 of the message" in out
    assert "traffic: gpu01->gpu02 gpu02->gpu03 gpu03->gpu04 gpu04->gpu01" in out
    assert "a change starts once all 4 ranks asked" in out


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            ("configurations: [rd0, rd1]}", "configurations: [rd1, rd0]}"),
            "stage 0's 'rd1' must link rank r with r xor 1",
        ),
        (
            ("[ring, rd0, rd1, rd0-chip, rd1-chip]", "[ring, rd0, rd1]"),
            "list rd0-chip, rd1-chip under job.fabric_service",
        ),
        (("[ring]}", "[rd0]}"), "'rd0' has no duplex link gpu02 <-> gpu03, gpu04 <-> gpu01: no ring of the ranks"),
        (("case: [ring-ocs,", "case: [ring-nvl,"), "'ring-nvl' is none of `cases`"),
        (("size: [4096,", "size: [4,"), "4 is not a message size"),
    ],
)
def test_a_collective_that_cannot_run_is_refused_before_the_run(tmp_path, capsys, change, said):
    (tmp_path / "c.yaml").write_text(PLAYBOOK.replace(*change))
    assert main(["validate", str(tmp_path / "c.yaml")]) != 0
    out = capsys.readouterr()
    assert said in out.out + out.err, out.out + out.err
