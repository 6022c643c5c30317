"""`testbed plan` is the honest dry run: for every shipped playbook it prints every step of every trial (and of
setup and teardown), with the devices each drives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from rich.tree import Tree

from testbed.cli.plan_view import MAX_LISTED, _compress_lists, _ranks, names, print_plan
from testbed.config.expand import parse_range
from testbed.documents import load_inventory, load_playbook
from testbed.plan import make_plan
from testbed.steps import (
    STEP_KINDS,
    ApplyStep,
    FaultDetectStep,
    FaultInjectStep,
    HealthStep,
    JobMeasureStep,
    Planned,
    RailIterateStep,
    walk,
)

REPO = Path(__file__).resolve().parent.parent
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yaml"))
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
OPUS = REPO / "playbooks/inventory/opus-2048.yaml"


def inventory_of(path: Path) -> Path:
    """The lab a shipped playbook is written for: opus-*.yaml for the Opus lab, the others for the rack."""
    return OPUS if path.stem.startswith("opus-") else INVENTORY


def shown(plan) -> str:
    console = Console(record=True, width=400, file=open("/dev/null", "w"))  # noqa: SIM115
    print_plan(console, plan, str(INVENTORY))
    return console.export_text()


def expand(listed: str) -> list[str]:
    """A list the plan shows ("h[001:120], h122, rail[0:7]") as the inventory expands each of its items."""
    out = []
    for item in listed.split(", "):
        rng = parse_range(item)
        out += [item] if rng is None else [name for name, _ in rng.names()]
    return out


def test_every_kind_of_planned_step_has_its_own_description():
    """A planned step that fell back on Planned.describe would show its label only; each kind says more."""
    kinds = {type(p) for path in PLAYBOOKS for p in plan_of(path).all_steps()}
    assert len(STEP_KINDS.names()) == 16 and len(kinds) >= 12
    assert [k.__name__ for k in kinds if k.describe is Planned.describe] == []


def plan_of(path):
    inventory = load_inventory(inventory_of(path)).model
    return make_plan(load_playbook(path, inventory).model, inventory, trials=3)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.stem)
def test_plan_prints_every_step_of_every_trial_with_its_devices(path):
    plan = plan_of(path)
    text = shown(plan)
    # every trial is under a branch: "trial i" or "trials a..b"
    covered = set()
    for match in re.finditer(r"trials? (\d+)(?:\.\.(\d+))?", text):
        covered.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    assert covered >= {t.index for t in plan.trials}
    job = plan.playbook.job
    for trial in [*plan.trials, type("Once", (), {"steps": (*plan.setup, *plan.teardown)})]:
        for step in walk(trial.steps):
            assert step.label in text, f"{path.name}: step {step.label!r} is not shown"
            if isinstance(step, ApplyStep):
                for switch, pairs in step.circuits.items():
                    assert f"{switch}: {len(pairs)} circuits" in text
            if isinstance(step, RailIterateStep):
                for phase in step.phases:
                    for switch, pairs in phase.apply.circuits.items():
                        assert f"{switch}: {len(pairs)} circuits" in text
            if isinstance(step, FaultInjectStep) and step.device is not None:
                assert f"{step.device}'s connection" in text
            elif isinstance(step, FaultDetectStep | FaultInjectStep | JobMeasureStep):
                assert f"rank {step.rank} ({job.ranks[step.rank]})" in text
            if isinstance(step, HealthStep):  # every host, in order; on a large lab as ranges (h[001:256])
                assert list(step.hosts) in [expand(listed) for listed in re.findall(r"on \d+ hosts: (.*)", text)]
    if job is not None:
        assert f"{len(job.ranks)} ranks on" in text
        for switch, pairs in plan.job_circuits.items():
            assert f"{switch}: {len(pairs)} circuits" in text
    # every device once, on a line of its own or, on a large lab, in a line of devices alike (h[001:256]: ...)
    listed = [name for names in re.findall(r"── (.+?): [\w.-]+ via ", text) for name in expand(names)]
    assert sorted(listed) == sorted(plan.devices)


# --- a large lab: lists of names are written as inventory ranges --------------------------------------------


def opus_plan(path, trials=None):
    inventory = load_inventory(OPUS).model
    return make_plan(load_playbook(path, inventory).model, inventory, trials=trials)


def rendered(plan, width=100) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"))  # noqa: SIM115
    print_plan(console, plan, str(OPUS))
    return console.export_text()


def test_the_opus_plan_names_its_256_hosts_as_a_range():
    plan = opus_plan(REPO / "playbooks/gpu-health.yaml")
    (health,) = [s for s in walk(plan.trials[0].steps) if isinstance(s, HealthStep)]
    assert len(health.hosts) == 256
    for width in (80, 100, 400):
        text = rendered(plan, width)
        assert len(text.splitlines()) < 40, text
        assert "h002" not in text  # no host is listed one by one
    text = rendered(plan, 400)
    assert f"{health.label}: nvidia-smi and kernel Xids on 256 hosts: h[001:256]" in text
    assert "h[001:256]: gpu_host via ssh at lab@{name}.lab.example:22 (reads)" in text
    assert "trial 0" in text


def test_the_10_host_rack_still_lists_every_host():
    plan = plan_of(REPO / "playbooks/gpu-health.yaml")
    text = shown(plan)
    hosts = [f"gpu{n:02d}" for n in range(1, 11)]
    assert f"on 10 hosts: {', '.join(hosts)}" in text
    for host in hosts:
        assert f"{host}: gpu_host via ssh at lab@{host}.lab.example:22 (reads)" in text
    assert "[" not in text and "{name}" not in text


def test_a_large_job_shows_its_ranks_spares_and_circuits_bounded_and_exact(tmp_path):
    ranks = [f"h{n:03d}" for n in [*range(1, 120), *range(121, 201)]] + ["h120"]
    spares = [f"h{n:03d}" for n in range(201, 257)]
    playbook = tmp_path / "opus-job.yaml"
    playbook.write_text(
        yaml.safe_dump(
            {
                "name": "opus-job",
                "trials": 2,
                "seed": 0,
                "job": {
                    "command": ["testbed-train", "--steps", "100"],
                    "ranks": ranks,
                    "fabric": {"topology": "ring", "port": "r0"},
                    "spares": spares,
                },
                "steps": [
                    {"action": "job.start", "wait_steps": 15},
                    {"action": "failover", "fault": {"kind": "gpu.fail"}, "heartbeat_ms": 50},
                    {"action": "job.stop"},
                ],
            }
        )
    )
    plan = opus_plan(playbook)
    text = rendered(plan, 400)
    assert len(text.splitlines()) < 40, text
    assert (
        "ranks: 0..118 on h[001:119] (one each, in order); 119..198 on h[121:200] (one each, in order); 199 on h120"
        in text
    )
    starts = re.findall(r"start job: 200 ranks on (.*)", text)
    assert len(starts) == 2 and all(expand(listed) == list(dict.fromkeys(ranks)) for listed in starts)  # rank order
    assert "spares a failover may use: h[201:256]" in text
    assert text.count("choose a spare (h[201:256])") == 2
    for switch, pairs in plan.job_circuits.items():  # the count, and only the first few circuits
        assert f"{switch}: {len(pairs)} circuits: " in text and len(pairs) == 200
    assert "h[001:256]: gpu_host via ssh at lab@{name}.lab.example:22 (writes)" in text
    assert "rail0: ocs via polatis-scpi at TCPIP0::192.0.2.100::5025::SOCKET (writes)" in text
    for trial in plan.trials:
        for step in walk(trial.steps):
            assert step.label in text
            if isinstance(step, FaultDetectStep | JobMeasureStep):
                assert f"rank {step.rank} ({ranks[step.rank]})" in text


def test_ranks_several_to_a_host_are_counted_per_host():
    assert _ranks([f"h{n:03d}" for n in range(1, 257) for _ in range(8)]) == "0..2047 on h[001:256] (8 each, in order)"
    assert _ranks(["gpu01", "gpu02", "gpu01"]) == "0:gpu01, 1:gpu02, 2:gpu01"  # short: as it was
    many = ["a", "a", "b", "b", "b", *[f"h{n}" for n in range(1, 20)], "h1"]
    assert _ranks(many) == "0..1 on a; 2..4 on b; 5..23 on h[1:19] (one each, in order); 24 on h1"


def test_only_long_lists_of_device_names_are_compressed():
    hosts = [f"h{n:03d}" for n in range(1, 21)]
    assert names(hosts[:MAX_LISTED]) == ", ".join(hosts[:MAX_LISTED])
    assert names(hosts) == "h[001:020]"
    assert names([*hosts[:10], "rail0", *hosts[10:]]) == "h[001:010], rail0, h[011:020]"  # in the order given
    tree = Tree("root")
    node = tree.add("on 20 hosts: " + ", ".join(hosts) + "; and x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12")
    node.add("[cyan]" + ", ".join(hosts[:5]))
    _compress_lists(node, set(hosts))
    assert node.label == "on 20 hosts: h[001:020]; and x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12"
    assert node.children[0].label == "[cyan]" + ", ".join(hosts[:5])  # short: as it was
