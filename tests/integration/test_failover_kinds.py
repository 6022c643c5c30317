"""A failover on every fault kind a failover takes (gpu.fail, process.kill, process.hang, host.power_off), on the
twin: the host the fault hit is the one replaced, whichever rank a watcher saw fail first; the survivors are
stopped (a stop on a host that lost power is that fault's expected outcome); each fault is healed; `testbed check`
passes. A kind that cannot fail a rank is refused at validate, at its line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from failover_every_kind import TRIALS, assert_each_failover_replaced_the_host_its_fault_hit, playbook

from testbed.cli import main
from testbed.ops.check import check_run


def test_a_failover_on_every_fault_kind_replaces_the_host_the_fault_hit(repo, tmp_path):
    (tmp_path / "every-kind.yaml").write_text(playbook())
    done = subprocess.run(
        [sys.executable, "-m", "testbed", "run", str(tmp_path / "every-kind.yaml"), "--emulate"]
        + ["--results", str(tmp_path / "results")],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert_each_failover_replaced_the_host_its_fault_hit(run_dir)
    checked = check_run(run_dir)
    assert checked.ok, checked.checks
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == TRIALS


def test_a_fault_kind_that_fails_no_rank_is_refused_in_a_failover_at_its_line(repo, tmp_path, capsys):
    text = playbook().replace("kind: gpu.fail", "kind: [gpu.fail, host.straggle]")
    (tmp_path / "straggle.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "straggle.yaml")]) == 2
    printed = capsys.readouterr()
    err = printed.out + printed.err
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "host.straggle" in row)
    assert f"straggle.yaml:{line}:" in err and "host.straggle does not" in err and "fault.inject" in err
