"""The Opus rail sweep on the twin: provisioning hides a small OCS delay behind compute, on-demand pays for
every change, and a delay longer than the compute window stalls both. Lower bounds only (each follows
from the switching time and the delays), so a busy machine cannot make the test pass wrongly.
"""

from __future__ import annotations

import json

from testbed.cli.main import main

PLAYBOOK = """\
name: rail-small
trials: 1
configurations:
  tp: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]}
  dp: {links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]}
workloads:
  card:
    phases:
      - {name: tp, configuration: tp, compute_ms: 60}
      - {name: dp, configuration: dp, compute_ms: 40}
sweep:
  mode: [static, on-demand, provisioning]
  delay_ms: [0, 20, 200]
steps:
  - {action: rail.iterate, workload: card, mode: "${mode}", delay_ms: "${delay_ms}", iterations: 3}
"""
SWITCHING_MS = 25  # the emulated rack's OCS


def test_provisioning_hides_small_delays_and_on_demand_does_not(ray_cluster, repo, tmp_path, capsys):
    (tmp_path / "rail.yaml").write_text(PLAYBOOK)
    code = main(
        [
            "run",
            str(tmp_path / "rail.yaml"),
            "--emulate",
            "--results",
            str(tmp_path / "r"),
            "--inventory",
            str(repo / "playbooks/inventory/emulated-rack.yaml"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    run_dir = next((tmp_path / "r").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    t = {(p["point"]["mode"], p["point"]["delay_ms"]): p["spans"]["iteration.time"]["p50_ms"] for p in summary["sweep"]}
    assert len(t) == 9 and all(p["spans"]["iteration.time"]["n"] == 3 for p in summary["sweep"])
    compute = 60 + 40
    for delay in (0, 20, 200):
        assert t[("static", delay)] >= compute  # no controller: compute only
        # on-demand waits for both changes of every iteration: switch time plus the delay, each
        assert t[("on-demand", delay)] >= compute + 2 * (SWITCHING_MS + delay)
    # A 20 ms delay fits in the compute windows (60 and 40 ms): provisioning hides it, on-demand cannot.
    assert t[("provisioning", 20)] < t[("on-demand", 20)] - 2 * SWITCHING_MS
    # 200 ms does not fit: provisioning stalls for what each change overruns its window.
    assert t[("provisioning", 200)] >= compute + (SWITCHING_MS + 200 - 60) + (SWITCHING_MS + 200 - 40)
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "sweep_iteration_time.png").is_file()
