"""Failover of a real PyTorch job against testbed-train's, and the framework's share of each.

    python bench/torch_failover.py [--trials 2] [--restarts 2] [--rounds 2]

Needs PyTorch (pip install 'testbed[torch]'). Two jobs, the same playbook otherwise
(playbooks/torch-failover-restart.yaml: four ranks, one per host, under PyTorch's own torchrun,
TESTBED_TWIN_TORCHRUN=real; a random rank's GPU fails and the spare is swapped in over the OCS):
- torch: its job as it is, testbed-torch-train (DistributedDataParallel over gloo, hostside/torch_train.py);
- train: the same with gpu-failover's testbed-train command (its own NumPy ring).
So the two differ in the program alone. In alternating rounds (the order turns every round), for each job:
- measured: `testbed run` of the playbook with --trials failovers; each one's failover.total (fault_injected ->
  the spare's first optimizer step after the resume);
- the job's own restart, measured alone: one torchrun per host started over SSH with nothing of the framework
  around it (the torchrun command lines, environment and working directories the runner uses, the failed rank's
  host replaced by a spare, peers reached directly), from the first launch command to the spare's first step
  after the resume.

Framework share = measured p50 - (restart alone p50 + the OCS switching time + half the detection heartbeat), as
in bench/failover.py. The survivors' teardown is not in the limit (the framework overlaps it with the rewiring):
PyTorch's torchrun takes seconds to stop its workers after SIGTERM, and that shows in both jobs' shares.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import compile_project, quiet_console, stats, write_out  # noqa: E402
from failover import BareJob, _free_ports, bare_restarts, ground_truth_figures  # noqa: E402
from rich.console import Console  # noqa: E402

from testbed.documents import load_inventory, load_playbook  # noqa: E402
from testbed.engine.ray_session import ray_session  # noqa: E402
from testbed.engine.run import RunOptions  # noqa: E402
from testbed.lab import run_plan  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.steps.failover import Failover  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks/torch-failover-restart.yaml"  # restart under torchrun: this bench measures it
TRAIN_PLAYBOOK = REPO / "playbooks/gpu-failover.yaml"  # whose testbed-train command the train job runs
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
JOBS = ("torch", "train")


def playbook(job: str):
    """The torch-failover playbook, with testbed-train's command for the train job."""
    inv = load_inventory(INVENTORY).model
    pb = load_playbook(PLAYBOOK, inv).model
    if job == "train":
        command = load_playbook(TRAIN_PLAYBOOK, inv).model.job.command
        pb = pb.model_copy(update={"job": pb.job.model_copy(update={"command": list(command)})})
    return inv, pb


def framework_failovers(job: str, trials: int, results: Path) -> dict:
    """One `testbed run` of the job's playbook: each trial's failover segments (ms) and the ground truth."""
    inv, pb = playbook(job)
    plan = make_plan(pb, inv, trials=trials)
    with ray_session(None):
        outcome = run_plan(plan, RunOptions(str(PLAYBOOK), str(INVENTORY), results, emulate=True), quiet_console())
    if outcome.status != "ok":
        raise RuntimeError(f"torch-failover ({job}) run {outcome.run_dir} failed: {outcome.error}")
    spans: dict[str, list[float]] = {}
    for line in (outcome.run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "measure" and e["op"].startswith("failover."):
            spans.setdefault(e["op"].removeprefix("failover."), []).append(e["data"]["ms"])
    return {"run_dir": str(outcome.run_dir), "spans": spans, "ground_truth": outcome.summary.get("ground_truth")}


class BareTorchrun(BareJob):
    """The job launched as the runner launches it under `launcher: torchrun` (testbed/engine/job/
    torchrun_launcher.py): one torchrun per host, node i the i-th host, static rendezvous at node 0, a new
    rendezvous id each launch; each host's handle stands for its one rank.
    """

    def launch(self, hosts: list[str]) -> None:
        self.launches += 1
        ports = _free_ports(len(hosts) + 1)
        peers, endpoint = ",".join(f"127.0.0.1:{p}" for p in ports[:-1]), f"127.0.0.1:{ports[-1]}"
        env = {
            **self.job.env,
            "TESTBED_MASTER_HOST": hosts[0],
            "TESTBED_PEERS": peers,
            "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
        }

        def start(node: int, host: str):
            command = [
                "torchrun",
                *("--nnodes", str(len(hosts)), "--node-rank", str(node), "--nproc-per-node", "1"),
                *("--rdzv-backend", "static", "--rdzv-endpoint", endpoint, "--rdzv-id", f"bench-{self.launches}"),
                *("--max-restarts", "0", "--no-python", *self.job.command),
            ]
            handle = self.drivers[host].run_job(
                command, name=f"node{node}.{self.launches}", gpus=[0], env=env, workdir=f"testbed-jobs/node{node}"
            )
            return node, host, handle

        for node, host, handle in self.pool.map(lambda a: start(*a), enumerate(hosts)):
            self.handles[node] = (host, handle)


def restart_alone(job: str, restarts: int) -> list[float]:
    """ms from the first torchrun launch command to the first step (after the resume) of the rank moved to a
    spare, `restarts` times; the job first runs past a checkpoint.
    """
    inv, pb = playbook(job)
    return bare_restarts(inv, pb.job, BareTorchrun, restarts)


def modelled_delays() -> dict:
    """The device delays the twin models on the failover's path, from the inventory and the playbook."""
    inv, pb = playbook("torch")
    switching = max(d.emulation.switching_time_ms for d in inv.devices.values() if d.kind == "ocs")
    heartbeat = next(s.heartbeat_ms for s in pb.steps if isinstance(s, Failover))
    return {"ocs_switching_ms": switching, "heartbeat_ms": heartbeat, "detection_ms": heartbeat / 2}


def _figures(spans: dict[str, list[float]], alone: list[float], truths: list, delays: dict) -> dict:
    limit = [a + delays["ocs_switching_ms"] + delays["detection_ms"] for a in alone]
    out = {
        "measured_total_ms": stats(spans["total"]),
        "segments_p50_ms": {k: float(np.median(v)) for k, v in spans.items()},
        "restart_alone_ms": stats(alone),
        "limit_ms": stats(limit),
        "ground_truth": ground_truth_figures(truths),
    }
    out["framework_share_p50_ms"] = out["measured_total_ms"]["p50"] - out["limit_ms"]["p50"]
    out["framework_share_fraction"] = out["framework_share_p50_ms"] / out["measured_total_ms"]["p50"]
    return out


def measure(trials: int = 2, restarts: int = 2, rounds: int = 2, console: Console | None = None) -> dict:
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("the PyTorch job needs PyTorch: pip install 'testbed[torch]' (its CPU build is enough)")
    console = console or Console()
    delays = modelled_delays()
    spans: dict[str, dict[str, list[float]]] = {job: {} for job in JOBS}
    alone: dict[str, list[float]] = {job: [] for job in JOBS}
    truths: dict[str, list] = {job: [] for job in JOBS}
    failed_runs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-torch-failover-") as tmp:
        for r in range(rounds):
            for job in JOBS if r % 2 == 0 else reversed(JOBS):
                try:
                    fw = framework_failovers(job, trials, Path(tmp) / "results")
                except RuntimeError as exc:  # reported with the figures, and the run made again once
                    failed_runs.append(str(exc))
                    console.print(f"[yellow]round {r + 1}: {exc}; running it again[/]")
                    fw = framework_failovers(job, trials, Path(tmp) / "results")
                for name, values in fw["spans"].items():
                    spans[job].setdefault(name, []).extend(values)
                truths[job].append(fw["ground_truth"])
                alone[job] += restart_alone(job, restarts)
                console.print(
                    f"round {r + 1}/{rounds} {job}: failover.total p50 {np.median(spans[job]['total']):.0f} ms, "
                    f"restart alone p50 {np.median(alone[job]):.0f} ms"
                )
    result = {
        "rounds": rounds,
        "trials_per_round": trials,
        "restarts_per_round": restarts,
        "modelled_delays_ms": delays,
        "jobs": {job: _figures(spans[job], alone[job], truths[job], delays) for job in JOBS},
        "failed_testbed_runs": failed_runs,
    }
    torch_p50 = result["jobs"]["torch"]["measured_total_ms"]["p50"]
    result["ratio_p50_torch_vs_train"] = torch_p50 / result["jobs"]["train"]["measured_total_ms"]["p50"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="failovers per testbed run")
    parser.add_argument("--restarts", type=int, default=2, help="bare restarts per job and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.trials, args.restarts, args.rounds, console)
    for job in JOBS:
        f = result["jobs"][job]
        console.print(
            f"{job}: failover p50 {f['measured_total_ms']['p50']:.0f} ms, restart alone p50 "
            f"{f['restart_alone_ms']['p50']:.0f} ms; framework share {f['framework_share_p50_ms']:.0f} ms "
            f"({100 * f['framework_share_fraction']:.0f} %)"
        )
    console.print(f"torch / train failover p50: {result['ratio_p50_torch_vs_train']:.2f}x")
    write_out("torch_failover", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
