"""The framework's time per job request to the fabric service (issue 18): a real phased job asks for its rails.

`testbed run --emulate` of the rail playbook cut to on-demand and provisioning at delay 0 (8 ranks, the emulated
rack's 25 ms OCS, jitter 0), then, in the same run, the same two configurations applied by plain fabric.apply
steps. From the run's events:
- request -> command: from the fabric service reading the request that completed a change's barrier (the last
  rank's) to the switch's first command written (`fabric_service.command_time`);
- light -> answer: per request that waited for the change, from the configuration being ready (light verified)
  to its answer being sent (`fabric_service.answer_time`);
- baseline: a fabric.apply step's own path to the same switch, from its invoke being recorded (just before the
  call leaves for the device's actor) to the first command written: the Ray hop and the driver, which a request
  takes too. The ratio says what the service adds around it.
Rounds alternate nothing: both are in each run, interleaved step by step in time.

    python bench/fabric_service.py [--rounds 2] [--iterations 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import REPO, compile_project, stats, write_out
from rich.console import Console

INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
PLAYBOOK = REPO / "playbooks/rail-reconfig.yaml"


def playbook(iterations: int, applies: int) -> str:
    text = PLAYBOOK.read_text()
    head = text.split("sweep:")[0]
    steps = "".join(
        f"  - {{action: fabric.apply, configuration: {'tp' if i % 2 == 0 else 'dp'}}}\n" for i in range(applies)
    )
    return (
        head
        + "sweep:\n  mode: [on-demand, provisioning]\n  delay_ms: [0]\n\nsteps:\n"
        + steps
        + f'  - {{action: rail.train, workload: dense-2phase, mode: "${{mode}}", delay_ms: "${{delay_ms}}", '
        f"iterations: {iterations}}}\n\nteardown:\n  - {{action: fabric.clear}}\n"
    )


def run_once(tmp: Path, n: int, iterations: int) -> dict[str, list[float]]:
    inv = tmp / "rack.yaml"
    inv.write_text(INVENTORY.read_text().replace("jitter_ms: 0.5", "jitter_ms: 0"))
    pb = tmp / f"rail-bench-{n}.yaml"
    pb.write_text(playbook(iterations, applies=iterations))
    results = tmp / f"results-{n}"
    cmd = [sys.executable, "-m", "testbed", "run", str(pb), "--emulate", "--inventory", str(inv)]
    proc = subprocess.run([*cmd, "--results", str(results)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"testbed run failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    run_dir = next(results.iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    out: dict[str, list[float]] = {"command": [], "answer": [], "apply": []}
    for e in events:
        if e["type"] == "measure" and e["op"] == "fabric_service.command_time":
            out["command"].append(e["data"]["ms"])
        elif e["type"] == "measure" and e["op"] == "fabric_service.answer_time":
            out["answer"].append(e["data"]["ms"])
    invokes = [e for e in events if e["type"] == "invoke" and e["op"].endswith("reconfigure")]
    sent = [e for e in events if e["op"] == "sent" and e.get("device") == "ocs1"]
    for inv_event in invokes:
        if not str(inv_event.get("step", "")).startswith("apply "):
            continue
        after = [s["mono_ns"] for s in sent if s["mono_ns"] >= inv_event["mono_ns"]]
        if after:
            out["apply"].append((min(after) - inv_event["mono_ns"]) / 1e6)
    return out


def measure(rounds: int = 2, iterations: int = 20, console: Console | None = None) -> dict:
    console = console or Console()
    samples: dict[str, list[float]] = {"command": [], "answer": [], "apply": []}
    with tempfile.TemporaryDirectory(prefix="bench-fabric-service-") as tmp:
        for r in range(rounds):
            got = run_once(Path(tmp), r, iterations)
            for key, values in got.items():
                samples[key] += values
            console.print(f"round {r + 1}: {', '.join(f'{k} n={len(v)}' for k, v in got.items())}")
    figures = {key: stats(values) for key, values in samples.items()}
    figures["ratio_command_vs_apply_p50"] = (
        figures["command"]["p50"] / figures["apply"]["p50"] if figures["apply"].get("n") else None
    )
    figures["iterations"], figures["rounds"] = iterations, rounds
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    figures = measure(args.rounds, args.iterations)
    print(json.dumps(figures, indent=2))
    write_out("fabric_service", figures)


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    main()
