"""The PCCL-style collective sweep (rail.train with message_bytes): four ranks all-reduce a message over a duplex
ring that never changes, and by recursive doubling with the topology reconfigured per stage on the OCS and on the
photonic chip. Every case moves its algorithm's bytes over the twin's data plane; recursive doubling on the OCS
pays every stage's switch (a lower bound from the 25 ms switching time); the report gives the sizes x cases table
with the crossover and the figure; the run checks."""

from __future__ import annotations

import json

import pytest

from testbed.cli import main
from testbed.collective_view import collective_data, crossover

PLAYBOOK = """\
name: collective-small
trials: 1
configurations:
  ring: {links: ["gpu01:p0 <-> gpu02:p1", "gpu02:p0 <-> gpu03:p1", "gpu03:p0 <-> gpu04:p1", "gpu04:p0 <-> gpu01:p1"]}
  rd0-ocs: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]}
  rd1-ocs: {links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]}
  rd0-chip: {links: ["gpu01:p2 <-> gpu02:p2", "gpu03:p2 <-> gpu04:p2"]}
  rd1-chip: {links: ["gpu01:p2 <-> gpu03:p2", "gpu02:p2 <-> gpu04:p2"]}
workloads:
  ring:
    phases:
      - {name: s1, configuration: ring, compute_ms: 0, share: 0.125}
      - {name: s2, configuration: ring, compute_ms: 0, share: 0.125}
      - {name: s3, configuration: ring, compute_ms: 0, share: 0.125}
      - {name: s4, configuration: ring, compute_ms: 0, share: 0.125}
      - {name: s5, configuration: ring, compute_ms: 0, share: 0.125}
      - {name: s6, configuration: ring, compute_ms: 0, share: 0.125}
    static: ring
  rd-ocs:
    phases:
      - {name: stage0, configuration: rd0-ocs, compute_ms: 0}
      - {name: stage1, configuration: rd1-ocs, compute_ms: 0}
  rd-chip:
    phases:
      - {name: stage0, configuration: rd0-chip, compute_ms: 0}
      - {name: stage1, configuration: rd1-chip, compute_ms: 0}
job:
  command: [testbed-train, --timeout, "60"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric_service:
    configurations: [ring, rd0-ocs, rd1-ocs, rd0-chip, rd1-chip]
    min_power_dbm: -10
sweep:
  message_bytes: [4096, 1048576]
setup:
  - {action: device.calibrate, device: chip1}
steps:
  - {action: rail.train, workload: ring, mode: static, message_bytes: "${message_bytes}", measure: ring, iterations: 2}
  - {action: rail.train, workload: rd-ocs, mode: on-demand, message_bytes: "${message_bytes}",
     measure: rd-ocs, iterations: 2}
  - {action: rail.train, workload: rd-chip, mode: on-demand, message_bytes: "${message_bytes}",
     measure: rd-chip, iterations: 2}
"""
SWITCHING_MS = 25


@pytest.fixture(scope="module")
def collective_run(ray_cluster, repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collective")
    (tmp / "c.yaml").write_text(PLAYBOOK)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    assert main(["run", str(tmp / "c.yaml"), "--emulate", "--results", str(tmp / "r"), "--inventory", inventory]) == 0
    return next((tmp / "r").iterdir())


def test_every_case_and_size_is_measured_and_reconfiguring_on_the_ocs_pays_each_stage(collective_run):
    summary = json.loads((collective_run / "summary.json").read_text())
    sizes, cases = collective_data(summary)
    assert sizes == [4096, 1048576] and set(cases) == {"ring", "rd-ocs", "rd-chip"}
    for size in sizes:
        assert all(size in by_size for by_size in cases.values())
        # two stages, each on a matching the switch must move to first (the first iteration's first is in place)
        assert cases["rd-ocs"][size] >= 2 * SWITCHING_MS
    # the crossover is the largest size where a case beat the ring, computed from these very numbers
    for case in ("rd-ocs", "rd-chip"):
        beat = [s for s in sizes if cases[case][s] < cases["ring"][s]]
        assert crossover(cases["ring"], cases[case]) == (max(beat) if beat else None)


def test_each_phase_moved_its_share_of_the_message_over_the_data_plane(collective_run):
    events = [json.loads(line) for line in (collective_run / "events.jsonl").read_text().splitlines()]
    counted = [e["data"] for e in events if e["op"] == "rail.bytes"]
    assert len(counted) == 2 * (1 + 2 + 2)  # sizes x (the ring steps together, and each stage of the two others)
    for c in counted:
        assert c["job_bytes"] > 0 and c["plane_bytes"] == c["job_bytes"], c
    ring_1m = [c for c in counted if c["config"] == "ring" and c["job_bytes"] > 1_000_000]
    # the six steps over one ring, counted together: 6 x 4 ranks x 2 neighbours x 3 iterations (warm-up included)
    # x (1/8 of 1 MiB + a 20-byte header)
    assert [c["job_bytes"] for c in ring_1m] == [6 * 4 * 2 * 3 * (131072 + 20)]


def test_report_shows_the_table_with_the_crossover_and_writes_the_figure(collective_run, capsys):
    capsys.readouterr()
    assert main(["report", str(collective_run)]) == 0
    out = capsys.readouterr().out
    assert "all-reduce p50 ms per message size" in out and "Crossover" in out
    assert "rd-ocs:" in out and "rd-chip:" in out and "4 KiB" in out and "1 MiB" in out
    assert (collective_run / "collective_time.png").is_file()
    assert main(["check", str(collective_run)]) == 0
