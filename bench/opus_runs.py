"""Opus runs: the 2048-GPU lab (playbooks/inventory/opus-2048.yaml, 256 hosts x 8 GPUs, 8 rails of 256-port
OCSes) driven end to end through the real CLI, as a user runs it.

    python bench/opus_runs.py [--rounds 1] [--trials 3]

Every run is `testbed run ... --inventory playbooks/inventory/opus-2048.yaml --emulate` started as a
subprocess from the repository (cold: a fresh process with its own private Ray instance, its own twin and
its own hubs), each in a results folder of its own; a run counts when the command exits 0. Its wall time is
from starting the command to its exit: start-up, the run, writing the results and shutting down, what a user
waits for. Each round makes four runs, one after the other (never two at once):

(1) health: `testbed run playbooks/gpu-health.yaml ... --trials 1`: every one of the 256 hosts identified
    and health-checked at once. Reported: wall time; the run's start-up phases (run.json "startup_s": twin,
    Ray, hubs, identify = the first command to every device, which opens 256 SSH connections); the
    health step's own span (health.wall).
(2) failover: `testbed run playbooks/opus-failover.yaml ... --trials T`: an 8-rank testbed-train job on
    h001..h008 over a 2 x 4 torus (rail 0 along the rows, rail 1 along the columns), a GPU lost per trial,
    a spare from the inventory's h249..h256 rewired in on both rails. Reported: wall time, failover.total.
(3) controller memory per device, from two runs of a generated playbook:
    full: hosts.health on all 256 hosts, then one fabric.apply of a full permutation (256 circuits) on all
          8 rails at once, twice (two trials), then fabric.clear: all 264 devices driven;
    base: the same on 1 host (h001) and 1 switch (rail0): 2 devices, the same process layout but 7 switch
          hubs fewer (a switch always has a hub process of its own; the hosts share one).
    controller = the `testbed` process plus every Ray worker process titled `ray::DeviceHub...` (the hubs
    that hold the drivers); per device = (full's controller PSS - base's) / 264. The twin (the `python -m
    emulators serve` process and its children) and Ray's own processes (GCS, raylet, its agents, idle
    workers) are not the controller; the twin's memory is reported on its own.

Memory: the command's whole process tree (the `testbed` process and all its descendants: Ray's processes,
the hubs, the twin and the job's ranks it starts) is sampled every 0.5 s from this process (benchlib.
TreeMemory): each process's Pss (/proc/PID/smaps_rollup: shared pages split among their users, so the sum
is what the tree holds) and VmRSS (shared pages counted in every process: an upper bound), summed over the
tree. Reported per run: the largest PSS sum and the largest RSS sum, with the split into controller, twin and
Ray at that sample, and each group's own largest sum; and the CPU seconds each group used (user + system, as
last sampled). Processes Ray leaves to init on shutdown (its agents) leave the tree and are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import REPO, TreeMemory, compile_project, stats, write_out
from rich.console import Console

INVENTORY = REPO / "playbooks/inventory/opus-2048.yaml"
HEALTH = REPO / "playbooks/gpu-health.yaml"
FAILOVER = REPO / "playbooks/opus-failover.yaml"
RAILS = 8
PORTS = 256
HOSTS = 256
DEVICES = HOSTS + RAILS
RUN_TIMEOUT_S = 1800
SAMPLE_EVERY_S = 0.5


def testbed_binary() -> str:
    """The CLI of this environment (the venv's `testbed` next to this Python), else the one on PATH."""
    beside = Path(sys.executable).parent / "testbed"
    if beside.exists():
        return str(beside)
    found = shutil.which("testbed")
    if found is None:
        raise RuntimeError("no `testbed` command: pip install -e . first")
    return found


def classify(pid: int, command: str) -> str:
    """controller: the `testbed` process and the device hubs; twin: the emulators; ray: the rest of the tree."""
    if command.startswith("ray::DeviceHub"):
        return "controller"
    if " -m emulators serve" in command:
        return "twin"
    if "bin/testbed run" in command:
        return "controller"
    return "ray"


def permutation(shift: int) -> list[list[int]]:
    """Every ingress i to egress PORTS + ((i - 1 + shift) mod PORTS) + 1 (as bench/opus_scale.py)."""
    return [[i, PORTS + (i - 1 + shift) % PORTS + 1] for i in range(1, PORTS + 1)]


def memory_playbook(hosts: list[str] | None, switches: list[str]) -> dict:
    """hosts.health on `hosts` (None: every host) and a full permutation on `switches`, then cleared."""
    health: dict = {"action": "hosts.health"}
    if hosts is not None:
        health["hosts"] = hosts
    return {
        "name": "opus-memory",
        "description": f"health of {len(hosts) if hosts else HOSTS} hosts and a full permutation on "
        f"{len(switches)} rail(s)",
        "trials": 2,
        "seed": 0,
        "configurations": {
            "shift1": {
                "description": "every ingress to the next egress",
                "circuits": {s: permutation(1) for s in switches},
            }
        },
        "steps": [health, {"action": "fabric.apply", "configuration": "shift1", "measure": "rail"}],
        "teardown": [{"action": "fabric.clear"}],
    }


def cli_run(playbook: Path, results: Path, trials: int | None = None) -> dict:
    """One cold `testbed run PLAYBOOK --inventory opus-2048.yaml --emulate` in `results` (a new folder):
    wall time, memory of its process tree, and what its run folder says.
    """
    results.mkdir(parents=True)
    command = [testbed_binary(), "run", str(playbook), "--inventory", str(INVENTORY), "--emulate"]
    command += ([] if trials is None else ["--trials", str(trials)]) + ["--results", str(results)]
    env = {**os.environ, "COLUMNS": "160"}
    out_path = results / "stdout.txt"
    with open(out_path, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        with TreeMemory(proc.pid, classify, inherit=("twin",), every_s=SAMPLE_EVERY_S) as memory:
            try:
                code = proc.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
        wall = time.monotonic() - start
    runs = [d for d in results.iterdir() if d.is_dir()]
    if code != 0 or len(runs) != 1:
        tail = out_path.read_text()[-2000:]
        why = "timed out" if code is None else f"exit status {code}"
        raise RuntimeError(f"`{' '.join(command[1:])}` {why} after {wall:.0f} s; its output ends:\n{tail}")
    run_dir = runs[0]
    run_json = json.loads((run_dir / "run.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "command": "testbed " + " ".join(str(c).replace(str(REPO) + "/", "") for c in command[1:]),
        "wall_s": wall,
        "startup_s": run_json.get("startup_s"),
        "status": summary.get("status"),
        "trials": summary.get("trials"),
        "spans": summary.get("spans") or {},
        "memory": memory.summary(),
        "processes": memory.processes(),
    }


def _span(run: dict, name: str, key: str = "p50_ms") -> float | None:
    return (run["spans"].get(name) or {}).get(key)


def _peak(runs: list[dict], key: str) -> dict:
    """The run with the largest whole-tree peak of `key` ("peak_pss" or "peak_rss")."""
    return max((r["memory"][key] for r in runs), key=lambda m: m["pss_mib" if key == "peak_pss" else "rss_mib"])


def _group_peak(run: dict, group: str) -> dict:
    return run["memory"]["group_peaks"].get(group) or {"pss_mib": 0.0, "rss_mib": 0.0, "processes": 0}


def measure(rounds: int = 1, trials: int = 3, console: Console | None = None) -> dict:
    console = console or Console()
    done: dict[str, list[dict]] = {"health": [], "failover": [], "memory_full": [], "memory_base": []}
    failed_runs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-opus-runs-") as tmp:
        tmp_path = Path(tmp)
        full_pb = tmp_path / "opus-memory-full.yaml"
        base_pb = tmp_path / "opus-memory-base.yaml"
        full_pb.write_text(yaml.safe_dump(memory_playbook(None, [f"rail{k}" for k in range(RAILS)]), sort_keys=False))
        base_pb.write_text(yaml.safe_dump(memory_playbook(["h001"], ["rail0"]), sort_keys=False))
        jobs = {
            "health": (HEALTH, 1),
            "failover": (FAILOVER, trials),
            "memory_full": (full_pb, None),
            "memory_base": (base_pb, None),
        }
        n = 0
        for r in range(rounds):
            # the memory pair alternates its order, so neither always runs right after the other
            order = ["health", "failover"] + (
                ["memory_full", "memory_base"] if r % 2 == 0 else ["memory_base", "memory_full"]
            )
            for kind in order:
                playbook, t = jobs[kind]
                n += 1
                try:
                    run = cli_run(playbook, tmp_path / f"results-{n}", t)
                except RuntimeError as exc:  # reported with the figures, and the run is made again once
                    failed_runs.append(str(exc))
                    console.print(f"[yellow]round {r + 1}, {kind}: {exc}; running it again[/]")
                    n += 1
                    run = cli_run(playbook, tmp_path / f"results-{n}", t)
                done[kind].append(run)
                mem = run["memory"]
                console.print(
                    f"round {r + 1}/{rounds} {kind}: {run['wall_s']:.1f} s, "
                    f"peak PSS {mem['peak_pss']['pss_mib']:.0f} MiB "
                    f"(RSS {mem['peak_rss']['rss_mib']:.0f} MiB), controller PSS "
                    f"{_group_peak(run, 'controller')['pss_mib']:.0f} MiB, twin "
                    f"{_group_peak(run, 'twin')['pss_mib']:.0f} MiB"
                )
    per_device = []
    for full, base in zip(done["memory_full"], done["memory_base"], strict=True):
        per_device.append(
            (_group_peak(full, "controller")["pss_mib"] - _group_peak(base, "controller")["pss_mib"]) / DEVICES
        )
    health, failover = done["health"], done["failover"]
    full, base = done["memory_full"], done["memory_base"]
    failover_totals = [_span(r, "failover.total") for r in failover if _span(r, "failover.total") is not None]
    return {
        "inventory": str(INVENTORY.relative_to(REPO)),
        "hosts": HOSTS,
        "switches": RAILS,
        "devices": DEVICES,
        "rounds": rounds,
        "failover_trials_per_run": trials,
        "sample_every_s": SAMPLE_EVERY_S,
        "health": {
            "command": health[0]["command"],
            "wall_s": stats([r["wall_s"] for r in health]),
            "health_step_ms": stats([_span(r, "health.wall") for r in health if _span(r, "health.wall")]),
            "startup_s": health[-1]["startup_s"],
            "peak_pss": _peak(health, "peak_pss"),
            "peak_rss": _peak(health, "peak_rss"),
            "cpu_s": health[-1]["memory"]["cpu_s"],
        },
        "failover": {
            "command": failover[0]["command"],
            "wall_s": stats([r["wall_s"] for r in failover]),
            "failover_total_p50_ms": stats(failover_totals),
            "startup_s": failover[-1]["startup_s"],
            "peak_pss": _peak(failover, "peak_pss"),
            "peak_rss": _peak(failover, "peak_rss"),
            "cpu_s": failover[-1]["memory"]["cpu_s"],
        },
        "controller_memory": {
            "full_devices": DEVICES,
            "base_devices": 2,
            "full_wall_s": stats([r["wall_s"] for r in full]),
            "base_wall_s": stats([r["wall_s"] for r in base]),
            "full_controller": [_group_peak(r, "controller") for r in full],
            "base_controller": [_group_peak(r, "controller") for r in base],
            "full_twin": [_group_peak(r, "twin") for r in full],
            "base_twin": [_group_peak(r, "twin") for r in base],
            "full_ray": [_group_peak(r, "ray") for r in full],
            "full_processes": full[-1]["processes"],
            "base_processes": base[-1]["processes"],
            "pss_mib_per_device": stats(per_device),
        },
        "failed_testbed_runs": failed_runs,
    }


def _tree(m: dict) -> str:
    groups = ", ".join(f"{k} {v['pss_mib']:.0f}" for k, v in sorted(m["groups"].items()))
    return f"{m['pss_mib']:.0f} MiB ({groups})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the four runs")
    parser.add_argument("--trials", type=int, default=3, help="failovers in each failover run")
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.rounds, args.trials, console)
    for kind in ("health", "failover"):
        f = result[kind]
        console.print(
            f"{kind}: `{f['command']}` {f['wall_s']['p50']:.1f} s "
            f"(max {f['wall_s']['max']:.1f} s, n={f['wall_s']['n']}); "
            f"peak PSS {_tree(f['peak_pss'])}; peak RSS {f['peak_rss']['rss_mib']:.0f} MiB; start-up {f['startup_s']}"
        )
    c = result["controller_memory"]
    console.print(
        f"controller PSS: {c['full_controller'][-1]['pss_mib']:.0f} MiB driving {c['full_devices']} devices, "
        f"{c['base_controller'][-1]['pss_mib']:.0f} MiB driving {c['base_devices']}: "
        f"{c['pss_mib_per_device']['p50']:.2f} MiB per device (target <= 5); twin "
        f"{c['full_twin'][-1]['pss_mib']:.0f} MiB PSS (base {c['base_twin'][-1]['pss_mib']:.0f} MiB)"
    )
    write_out("opus_runs", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
