"""bench/opus_runs.py's inputs and its memory sampler, without running the 2048-GPU lab: the failover playbook
plans on the Opus inventory (spares from the inventory, rails 0 and 1), the generated memory playbooks touch
264 and 2 devices, and TreeMemory follows a process tree and its groups.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

from testbed.documents import load_inventory, load_playbook
from testbed.plan import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import opus_runs  # noqa: E402
from benchlib import TreeMemory, process_tree  # noqa: E402


def _plan(playbook: Path):
    inv = load_inventory(opus_runs.INVENTORY).model
    return make_plan(load_playbook(playbook, inv).model, inv)


def test_opus_failover_plans_an_8_rank_job_on_rails_0_and_1_with_the_inventorys_spares():
    plan = _plan(opus_runs.FAILOVER)
    job = plan.playbook.job
    assert job.ranks == [f"h{n:03d}" for n in range(1, 9)]
    assert job.spares is None  # the inventory's: h249..h256
    spares = [f"h{n}" for n in range(249, 257)]
    assert plan.inventory.spares == spares
    assert {d for d in plan.devices if d.startswith("rail")} == {"rail0", "rail1"}
    assert set(plan.devices) == {"rail0", "rail1", *job.ranks, *spares}


def test_the_memory_playbooks_drive_all_264_devices_and_the_base_two(tmp_path):
    full = tmp_path / "full.yaml"
    full.write_text(yaml.safe_dump(opus_runs.memory_playbook(None, [f"rail{k}" for k in range(8)])))
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(opus_runs.memory_playbook(["h001"], ["rail0"])))
    assert len(_plan(full).devices) == opus_runs.DEVICES == 264
    assert _plan(base).devices == ("rail0", "h001")


def test_tree_memory_sums_a_process_tree_by_group_and_children_inherit_the_twins():
    # parent ("controller") -> child titled like the twin -> grandchild (counted as the twin)
    twin = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    spawn_twin = f"subprocess.Popen([sys.executable, '-c', {twin!r}, '-m emulators serve'])"
    code = f"import subprocess, sys, time; {spawn_twin}; time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while len(process_tree(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(process_tree(proc.pid)) == 3

        def classify(pid: int, command: str) -> str:
            return "twin" if command.endswith("-m emulators serve") else "controller"

        memory = TreeMemory(proc.pid, classify, inherit=("twin",), every_s=0.05)
        with memory:
            time.sleep(0.3)
    finally:
        for pid in reversed(list(process_tree(proc.pid))):
            subprocess.run(["kill", str(pid)], check=False)
        proc.wait()
    summary = memory.summary()
    assert summary["samples"] >= 2
    groups = summary["peak_pss"]["groups"]
    assert groups["controller"]["processes"] == 1 and groups["twin"]["processes"] == 2
    assert summary["peak_pss"]["pss_mib"] == sum(g["pss_mib"] for g in groups.values()) > 0
    assert summary["peak_rss"]["rss_mib"] >= summary["peak_pss"]["pss_mib"]
    assert {p["group"] for p in memory.processes()} == {"controller", "twin"}


def test_tree_memory_sees_the_machines_available_memory_fall_while_the_tree_holds_memory():
    held = 512 * 1024 * 1024  # large against what other work on the machine frees meanwhile
    code = f"import sys; sys.stdin.readline(); b = b'x' * {held}; print('held', flush=True); sys.stdin.readline()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with TreeMemory(proc.pid, lambda pid, command: "tree", every_s=0.05) as memory:
            proc.stdin.write("allocate\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "held\n"
            seen = memory.samples
            deadline = time.monotonic() + 20
            while memory.samples < seen + 2 and time.monotonic() < deadline:  # a sample taken while it is held
                time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert memory.mem_available_drop_mib >= 0.5 * held / 2**20  # most of it, less what the machine freed meanwhile
