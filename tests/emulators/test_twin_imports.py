"""What a twin process imports for the devices it serves: numpy only where a photonic mesh needs it. A twin starts
beside a run's Ray on the same cores, and every import is CPU taken from that start (docs/tuning.md, "A run's start
on two cores").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.documents import load_inventory
from testbed.twin.bridge import twin_spec

ROOT = Path(__file__).resolve().parents[2]
RACK = ROOT / "playbooks/inventory/emulated-rack.yaml"


def _imported_by_twin(only: set[str] | None) -> tuple[dict, set[str]]:
    """The endpoints a twin announced for the rack's devices in `only`, and every module it imported up to then and
    while it served until its standard input closed (Python's own -X importtime record, on its stderr).
    """
    spec = twin_spec(load_inventory(RACK).model, 0, only=only)
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "emulators", "serve", "-", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(spec.to_json() + "\n")
        proc.stdin.flush()
        endpoints = json.loads(proc.stdout.readline())
        _, err = proc.communicate(timeout=60)  # closes its standard input: the twin stops
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    modules = {line.split("|")[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    return endpoints, modules


@pytest.mark.parametrize("kinds", [("gpu_host",), ("gpu_host", "ocs")])
def test_a_twin_without_a_photonic_mesh_never_imports_numpy(kinds):
    devices = load_inventory(RACK).model.devices
    only = {name for name, dev in devices.items() if dev.kind in kinds}
    endpoints, modules = _imported_by_twin(only)
    assert sorted(endpoints["devices"]) == sorted(only)  # it served them all
    assert "emulators.dataplane.paths" in modules  # the data plane is there, without numpy
    assert "numpy" not in modules


def test_a_twin_with_the_mesh_imports_numpy_for_it():
    endpoints, modules = _imported_by_twin(None)
    assert any(ep["kind"] == "photonic_mesh" for ep in endpoints["devices"].values())
    assert "numpy" in modules  # the mesh's model (its transfer matrix) is numpy
