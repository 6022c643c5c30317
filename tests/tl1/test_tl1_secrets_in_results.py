"""A real run (no --emulate) that logs in to a TL1 switch with a password from the environment: no file of its
results folder holds the password, wherever the driver or the recorder might have written it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from emulators.twin import TwinProcess
from testbed.documents import load_inventory
from testbed.twin.bridge import point_at_twin, twin_spec


def files_holding(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_lab_run_over_tl1_leaves_its_password_in_no_file(repo, tmp_path):
    inventory = load_inventory(repo / "playbooks/inventory/emulated-rack-tl1.yaml").model
    spec = twin_spec(inventory, 0, only={"ocs1"})
    spec.password = secret = "Zq8-lab-tl1-pw-4471"  # as a lab's switch account has, in its operator's shell
    with TwinProcess(spec) as twin:
        lab = point_at_twin(inventory, twin.endpoints.to_json()).model_dump(mode="json", exclude_none=True)
        lab["emulated_only"] = False
        lab["devices"] = {"ocs1": lab["devices"]["ocs1"]}
        lab["devices"]["ocs1"]["transport"]["password_env"] = "LAB_TL1_PASSWORD"
        lab.pop("fibres", None)
        lab.pop("spares", None)
        (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
        (tmp_path / "pb.yaml").write_text(
            "name: tl1-cycle\ntrials: 2\nconfigurations:\n  a: {circuits: {ocs1: [[1, 33], [2, 34]]}}\n"
            "steps:\n  - {action: fabric.apply, configuration: a}\n  - {action: fabric.clear}\n"
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "testbed",
                "run",
                str(tmp_path / "pb.yaml"),
                "--inventory",
                str(tmp_path / "lab.yaml"),
            ]
            + ["--yes", "--results", str(tmp_path / "results")],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "LAB_TL1_PASSWORD": secret},
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_dir = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert "ACT-USER" in (run_dir / "audit.jsonl").read_text()  # it did log in, and its traffic is recorded
    assert files_holding(run_dir, secret) == []
    assert secret not in done.stdout + done.stderr
