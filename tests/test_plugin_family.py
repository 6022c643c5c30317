"""A new device family is new files plus a registration: tests/plugins/patchpanel is a package as another lab
would ship it (a patch-panel family, its driver, its emulator, its audit model, and a step kind of its own),
found through its entry points only (tests/plugins/patchpanel_family-0.1.dist-info), and a playbook on it
validates, plans, runs on the twin, and passes `testbed check`, with testbed's own code untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "plugins"

pytestmark = pytest.mark.timeout(300)

INVENTORY = """\
name: panel-lab
emulated_only: true
devices:
  panel1:
    kind: patch_panel
    driver: panel-tcp
    transport: {type: visa, resource: "TCPIP0::192.0.2.20::7000::SOCKET"}
    size: 16
  gpu01: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu01.example, user: lab}}
  gpu02: {kind: gpu_host, driver: ssh, transport: {type: ssh, host: gpu02.example, user: lab}}
fibres:
  - {host: gpu01, port: p0, switch: panel1, ingress: 1, egress: 17}
  - {host: gpu02, port: p0, switch: panel1, ingress: 2, egress: 18}
"""

PLAYBOOK = """\
name: panel-demo
trials: 2
configurations:
  pair: {links: ["gpu01:p0 <-> gpu02:p0"]}
  loop: {circuits: {panel1: [[1, 17], [2, 18]]}}
steps:
  - {action: fabric.apply, configuration: pair, measure: patch}
  - {action: fabric.apply, configuration: loop, measure: patch}
  - {action: panel.settle, name: settle after the loop}
teardown:
  - {action: fabric.clear}
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with the panel's package installed (on the path, with its dist-info)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("panel")
    (folder / "inventory.yaml").write_text(INVENTORY)
    (folder / "playbook.yaml").write_text(PLAYBOOK)
    return folder


def test_the_panel_is_unknown_without_its_package(lab):
    out = subprocess.run(
        [sys.executable, "-m", "testbed", "validate", str(lab / "inventory.yaml")],
        cwd=lab,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "patch_panel" in out.stdout  # "kind" must be one of the registered families


def test_a_family_from_another_package_validates_plans_runs_and_checks(lab):
    inventory = ["--inventory", str(lab / "inventory.yaml")]
    validated = cli("validate", str(lab / "inventory.yaml"), str(lab / "playbook.yaml"), *inventory, cwd=lab)
    assert validated.returncode == 0, validated.stdout + validated.stderr

    planned = cli("plan", str(lab / "playbook.yaml"), *inventory, cwd=lab)
    assert planned.returncode == 0, planned.stderr
    assert "panel1: patch_panel via panel-tcp" in planned.stdout
    assert "panel1: 2 circuits: 1>18 2>17" in planned.stdout  # the links, routed through the panel
    assert "settle after the loop: read back panel1" in planned.stdout  # the package's own step kind

    ran = cli("run", str(lab / "playbook.yaml"), *inventory, "--emulate", "--results", str(lab / "r"), cwd=lab)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = Path(ran.stdout.strip().splitlines()[-1].removeprefix("results: "))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == 2 and summary["spans"]["patch.total"]["n"] == 4
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {e["op"] for e in events if e.get("device") == "panel1" and e["type"] == "ok"} >= {
        "panel.identify",
        "panel.reconfigure",
        "panel.clear",
        "panel.connections",
    }
    settled = [e for e in events if e.get("step") == "settle after the loop" and e["type"] == "ok"]
    assert [e["op"] for e in settled] == ["panel.connections", "panel.connections"]  # once per trial
    audit = [json.loads(line)["data"] for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert "CONN 1,18\n" in audit  # the panel's own protocol went over the wire

    checked = cli("check", str(run_dir), cwd=lab)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok   final fabric matches history" in checked.stdout  # replayed through the panel's audit model


def test_a_driver_must_fit_its_device_kind(lab):
    wrong = (lab / "inventory.yaml").read_text().replace("driver: panel-tcp", "driver: polatis-scpi")
    (lab / "wrong.yaml").write_text(wrong)
    out = cli("validate", str(lab / "wrong.yaml"), cwd=lab)
    assert out.returncode == 2
    assert (
        "devices.panel1.driver: polatis-scpi drives kind ocs, not patch_panel (drivers for patch_panel: panel-tcp)"
        in (out.stdout.replace("\n", " "))
    )
