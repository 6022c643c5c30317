"""Start-up: what a user waits for around a short run, cold from the command line and warm in a session.

    python bench/startup.py [--rounds 5] [--warm-runs 10]

(a) Cold: `testbed run playbooks/ocs-reconfig.yaml --emulate --trials 1` (three reconfigurations, ~0.1 s of
    device work) as a user types it, a fresh process each round: wall time from spawn to exit, and to the
    summary table (the `results:` line it prints after the table, before shutting down), and to its first
    device command (its first `invoke` event, on the same CLOCK_MONOTONIC); run.json's
    `startup_s` gives where the first seconds went (twin, what was left of Ray's start once the twin was up,
    hubs, clocks, identify, and `to_first_command`, from the run's start to its first device command
    answered). The rest of the wall time is Python's start and imports before the run, and the shutdown
    after the table. Baseline, in alternating rounds: a fresh Python process that starts a local Ray
    instance as testbed does and shuts it down (ray_session), the floor of any tool built on Ray; and the
    same instance started by a plain ray.init in the same process, with every head process and the two fixed
    waits that testbed/engine/ray_local.py leaves out and cuts.
(b) Warm: in one process, `testbed.Lab(emulate=True)`, one run of the same playbook, then --warm-runs more:
    for each, the time from calling `lab.run` to its first device command going out (its first `invoke`
    event; both clocks are this machine's CLOCK_MONOTONIC). The first run's is the cold figure of a session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import REPO, compile_project, quiet_console, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

PLAYBOOK = REPO / "playbooks" / "ocs-reconfig.yaml"
INVENTORY = REPO / "playbooks" / "inventory" / "emulated-rack.yaml"
PHASES = ("twin", "ray", "hubs", "clocks", "identify", "to_first_command")
RAY_ALONE = (
    "import time; t = time.monotonic()\n"
    "from testbed.engine.ray_session import ray_session\n"
    "with ray_session(None) as ray:\n"
    "    up = time.monotonic() - t\n"
    "print(up)\n"
)
# The same instance (bounds, loopback, no dashboard) with Ray's own waits: what ray_local.py cuts.
RAY_PLAIN = (
    "import os, time; t = time.monotonic()\n"
    "os.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0')\n"
    "import ray\n"
    "from testbed.engine.ray_local import LOCAL_CPUS, LOCAL_OBJECT_STORE_BYTES\n"
    "ray.init(address='local', num_cpus=LOCAL_CPUS, object_store_memory=LOCAL_OBJECT_STORE_BYTES,\n"
    "         _node_ip_address='127.0.0.1', include_dashboard=False, log_to_driver=False, configure_logging=False)\n"
    "up = time.monotonic() - t\n"
    "ray.shutdown()\n"
    "print(up)\n"
)


def cold_cli(results: Path) -> dict:
    """One `testbed run` in a fresh process: wall to exit, to the table, and run.json's start-up phases."""
    command = [sys.executable, "-m", "testbed", "run", str(PLAYBOOK), "--emulate", "--trials", "1"]
    command += ["--results", str(results)]
    start_ns = time.monotonic_ns()  # CLOCK_MONOTONIC, the clock of the run's events
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    table_s, run_dir = None, None
    for line in proc.stdout:  # the last line before the shutdown names the results folder
        if line.startswith("results: "):
            table_s = time.monotonic() - start
            run_dir = Path(line.removeprefix("results: ").strip())
    stderr = proc.stderr.read()
    proc.wait()
    wall = time.monotonic() - start
    if proc.returncode != 0 or run_dir is None:
        raise RuntimeError(f"testbed run failed ({proc.returncode}): {stderr[-1500:]}")
    startup = json.loads((run_dir / "run.json").read_text())["startup_s"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    first = min(e["mono_ns"] for e in events if e["type"] == "invoke")
    return {
        "wall_s": wall,
        "first_command_s": (first - start_ns) / 1e9,
        "table_s": table_s,
        "shutdown_s": wall - table_s,
        "startup_s": startup,
    }


def ray_alone(plain: bool = False) -> dict:
    """A fresh Python that starts a local Ray instance as testbed does (plain: with Ray's own fixed waits, as a
    bare ray.init starts it), then shuts it down.
    """
    start = time.monotonic()
    script = RAY_PLAIN if plain else RAY_ALONE
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"Ray alone failed: {proc.stderr[-1500:]}")
    return {"wall_s": wall, "up_s": float(proc.stdout.strip().splitlines()[-1])}


def warm_session(results: Path, runs: int) -> dict:
    """Seconds from calling lab.run to the run's first device command: the first run, then `runs` more."""
    import testbed

    waits = []
    with testbed.Lab(INVENTORY, emulate=True, results=results, console=quiet_console()) as lab:
        for _ in range(runs + 1):
            called = time.monotonic_ns()
            run = lab.run(PLAYBOOK, trials=1)
            if not run.ok:
                raise RuntimeError(f"lab.run failed: {run.error}")
            first = min(e["mono_ns"] for e in run.events() if e["type"] == "invoke")
            waits.append((first - called) / 1e9)
    return {"first_run_s": waits[0], "warm_s": stats(waits[1:])}


def measure(rounds: int = 5, warm_runs: int = 10, console: Console | None = None) -> dict:
    console = console or Console()
    cold, alone, plain = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        results = Path(tmp) / "results"
        contenders = [
            (cold, lambda: cold_cli(results)),
            (alone, ray_alone),
            (plain, lambda: ray_alone(plain=True)),
        ]
        for r in range(rounds):
            # turning which goes first, so none always runs on a machine another just warmed
            for samples, contender in contenders[r % 3 :] + contenders[: r % 3]:
                samples.append(contender())
            last = cold[-1]
            console.print(
                f"round {r + 1}/{rounds}: testbed run {last['wall_s']:.2f} s (table at {last['table_s']:.2f} s), "
                f"Ray alone {alone[-1]['wall_s']:.2f} s (up {alone[-1]['up_s']:.2f} s; a plain ray.init up "
                f"{plain[-1]['up_s']:.2f} s)"
            )
        warm = warm_session(results, warm_runs)
    console.print(
        f"warm session: first run's first command after {warm['first_run_s']:.2f} s, then p50 "
        f"{warm['warm_s']['p50']:.3f} s"
    )
    walls = [c["wall_s"] for c in cold]
    phases = {p: float(np.median([c["startup_s"].get(p, 0.0) for c in cold])) for p in PHASES}
    return {
        "playbook": "ocs-reconfig.yaml --emulate --trials 1",
        "rounds": rounds,
        "cli_wall_s": stats(walls),
        "cli_first_command_s": stats([c["first_command_s"] for c in cold]),
        "cli_table_s": stats([c["table_s"] for c in cold]),
        "cli_shutdown_s": stats([c["shutdown_s"] for c in cold]),
        "cli_startup_phases_p50_s": phases,
        "ray_alone_wall_s": stats([a["wall_s"] for a in alone]),
        "ray_alone_up_s": stats([a["up_s"] for a in alone]),
        "ray_plain_up_s": stats([a["up_s"] for a in plain]),
        "ratio_cli_vs_ray_alone": float(np.median(walls) / np.median([a["wall_s"] for a in alone])),
        "warm": warm,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm-runs", type=int, default=10)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    result = measure(args.rounds, args.warm_runs)
    print(json.dumps(result, indent=2))
    write_out("startup", result)


if __name__ == "__main__":
    main()
