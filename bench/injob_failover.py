"""In-job recovery against restart, for the real PyTorch job on the twin, side by side in one run.

    python bench/injob_failover.py [--trials 10] [--rounds 2]

Needs PyTorch (pip install 'testbed[torch]'). Two playbooks, the same job (testbed-torch-train over gloo, four ranks,
one per host, a random rank's GPU lost, the spare swapped in over the OCS):
- in-job: playbooks/torch-failover.yaml (`recovery: in-job`): a spare parked since job.start takes the failed slot
  in the next generation; nothing is started, no checkpoint read;
- restart: playbooks/torch-failover-restart.yaml (`recovery: restart`, under PyTorch's torchrun): every rank stopped
  and started again, resuming from the newest checkpoint.
In alternating rounds (the order turns every round), a `testbed run --emulate` of each with --trials failovers;
each failover's failover.total (fault_injected -> the spare's first step) and its segments.

Framework share = measured p50 - (the job's own part: the `ready` and `first_step` segments' p50s, from the last
framework action, the generation published or every rank started, to the spare's first step) - the OCS switching
time - half the detection heartbeat. For restart this counts the relaunch calls as the framework's and the ranks'
start-up (PyTorch's import, the checkpoint read) as the job's; bench/torch_failover.py measures restart's share
against a restart run alone instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import compile_project, quiet_console, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

from testbed.documents import load_inventory, load_playbook  # noqa: E402
from testbed.engine.ray_session import ray_session  # noqa: E402
from testbed.engine.run import RunOptions  # noqa: E402
from testbed.lab import run_plan  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.steps.failover import Failover  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
PLAYBOOKS = {
    "in-job": REPO / "playbooks/torch-failover.yaml",
    "restart": REPO / "playbooks/torch-failover-restart.yaml",
}
JOB_PART = ("ready", "first_step")  # the segments from the framework's last action to the spare's first step


def failovers(mode: str, trials: int, results: Path) -> dict:
    """One `testbed run` of the mode's playbook: each failover's segments (ms)."""
    inv = load_inventory(INVENTORY).model
    plan = make_plan(load_playbook(PLAYBOOKS[mode], inv).model, inv, trials=trials)
    options = RunOptions(str(PLAYBOOKS[mode]), str(INVENTORY), results, emulate=True)
    with ray_session(None):
        outcome = run_plan(plan, options, quiet_console())
    if outcome.status != "ok":
        raise RuntimeError(f"{PLAYBOOKS[mode].name} run {outcome.run_dir} failed: {outcome.error}")
    spans: dict[str, list[float]] = {}
    for line in (outcome.run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "measure" and e["op"].startswith("failover."):
            spans.setdefault(e["op"].removeprefix("failover."), []).append(e["data"]["ms"])
    return spans


def modelled_delays() -> dict:
    """The device delays the twin models on the failover's path (the OCS, the heartbeat), from the files."""
    inv = load_inventory(INVENTORY).model
    pb = load_playbook(PLAYBOOKS["in-job"], inv).model
    switching = max(d.emulation.switching_time_ms for d in inv.devices.values() if d.kind == "ocs")
    heartbeat = next(s.heartbeat_ms for s in pb.steps if isinstance(s, Failover))
    return {"ocs_switching_ms": switching, "heartbeat_ms": heartbeat, "detection_ms": heartbeat / 2}


def figures(spans: dict[str, list[float]], delays: dict) -> dict:
    p50 = {k: float(np.median(v)) for k, v in spans.items()}
    total = stats(spans["total"])
    job_part = sum(p50.get(s, 0.0) for s in JOB_PART)
    share = total["p50"] - job_part - delays["ocs_switching_ms"] - delays["detection_ms"]
    return {
        "total_ms": total,
        "segments_p50_ms": p50,
        "job_part_p50_ms": job_part,
        "framework_share_p50_ms": share,
        "framework_share_fraction": share / total["p50"],
    }


def measure(trials: int, rounds: int, console: Console) -> dict:
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("the PyTorch job needs PyTorch: pip install 'testbed[torch]' (its CPU build is enough)")
    delays = modelled_delays()
    spans: dict[str, dict[str, list[float]]] = {mode: {} for mode in PLAYBOOKS}
    with tempfile.TemporaryDirectory(prefix="bench-injob-failover-") as tmp:
        for r in range(rounds):
            for mode in list(PLAYBOOKS) if r % 2 == 0 else reversed(PLAYBOOKS):
                for name, values in failovers(mode, trials, Path(tmp) / "results").items():
                    spans[mode].setdefault(name, []).extend(values)
                console.print(
                    f"round {r + 1}/{rounds} {mode}: failover.total p50 {np.median(spans[mode]['total']):.0f} ms "
                    f"(n={len(spans[mode]['total'])})"
                )
    result = {
        "rounds": rounds,
        "trials_per_round": trials,
        "modelled_delays_ms": delays,
        "modes": {mode: figures(spans[mode], delays) for mode in PLAYBOOKS},
    }
    modes = result["modes"]
    result["ratio_p50_restart_vs_in_job"] = modes["restart"]["total_ms"]["p50"] / modes["in-job"]["total_ms"]["p50"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="failovers per testbed run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.trials, args.rounds, console)
    for mode, f in result["modes"].items():
        console.print(
            f"{mode}: failover p50 {f['total_ms']['p50']:.0f} ms (n={f['total_ms']['n']}); segments p50 "
            + ", ".join(f"{k} {v:.0f}" for k, v in f["segments_p50_ms"].items() if k != "total")
            + f"; framework share {f['framework_share_p50_ms']:.0f} ms ({100 * f['framework_share_fraction']:.0f} %)"
        )
    console.print(f"restart / in-job failover p50: {result['ratio_p50_restart_vs_in_job']:.1f}x")
    console.print(f"written: {write_out('injob_failover', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
