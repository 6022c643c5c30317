"""Failover latency against its physical limit, and against the twin's ground truth.

    python bench/failover.py [--trials 10] [--restarts 10] [--rounds 3]

In alternating rounds:
- measured: `testbed run playbooks/gpu-failover.yaml --emulate` with --trials failovers; each one's
  failover.total (fault_injected -> first_step on the spare);
- the job's own restart, measured alone: testbed-train relaunched from its checkpoint on the same kind of
  emulated hosts with no framework around it (the same driver calls over SSH that the runner's start_job
  makes, all ranks at once, the failed rank on the spare, peers reached directly), timed from the first
  launch command to the spare's first step line.

physical limit (per restart) = the inventory's OCS switching time (the twin holds every new circuit dark
for it) + half the playbook's detection heartbeat (the emulated host's `tail --pid` checks the rank every
heartbeat, so a death is seen on average half a heartbeat later) + the restart measured alone.
Framework share = measured p50 - limit p50 (with the heartbeat counted in full, the share is half a
heartbeat smaller). The surviving ranks' teardown and the light check are not in the limit: the framework
overlaps them with the rewiring, and whatever they cost shows in its share.

Accuracy: a run's summary.json carries "ground_truth" when the twin records its own account of every
failover (testbed/results/accuracy.py): the error of measured total failover against the twin's truth, p50 / p99.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import compile_project, quiet_console, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

from drivers.gpuhost import GpuHostSsh  # noqa: E402
from drivers.transports.ssh import SshSettings, SshTransport  # noqa: E402
from emulators.twin import TwinProcess  # noqa: E402
from testbed.documents import load_inventory, load_playbook  # noqa: E402
from testbed.engine.ray_session import ray_session  # noqa: E402
from testbed.engine.run import RunOptions  # noqa: E402
from testbed.families.gpu_host.procedures import PROGRESS  # noqa: E402
from testbed.lab import run_plan  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.steps.failover import Failover  # noqa: E402
from testbed.twin.bridge import twin_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks/gpu-failover.yaml"
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
READY = r"^ready rank \d+ world \d+ step (\d+)"


# --- measured through the framework -----------------------------------------------------------------


def framework_failovers(trials: int, results: Path) -> dict:
    """One `testbed run` of the failover playbook: each trial's failover.total and its segments (ms), and
    the summary's ground truth if the run has one.
    """
    inv = load_inventory(INVENTORY).model
    plan = make_plan(load_playbook(PLAYBOOK, inv).model, inv, trials=trials)
    with ray_session(None):
        outcome = run_plan(plan, RunOptions(str(PLAYBOOK), str(INVENTORY), results, emulate=True), quiet_console())
    if outcome.status != "ok":
        raise RuntimeError(f"gpu-failover run {outcome.run_dir} failed: {outcome.error}")
    spans: dict[str, list[float]] = {}
    for line in (outcome.run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "measure" and e["op"].startswith("failover."):
            spans.setdefault(e["op"].removeprefix("failover."), []).append(e["data"]["ms"])
    return {"run_dir": str(outcome.run_dir), "spans": spans, "ground_truth": outcome.summary.get("ground_truth")}


# --- the job's own restart, alone -------------------------------------------------------------------


def _driver(name: str, ep: dict) -> GpuHostSsh:
    host, _, port = ep["ssh"].rpartition(":")
    settings = SshSettings(
        host=host, port=int(port), user=ep["user"], key_file=ep["key_file"], known_hosts=ep["known_hosts"]
    )
    return GpuHostSsh(SshTransport(settings, name, None), name)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class BareJob:
    """The playbook's job started and stopped the way the runner does it (GpuHostSsh.run_job per rank, same
    command, environment, job names and working directories), with nothing else around it.
    """

    def __init__(self, drivers: dict[str, GpuHostSsh], job) -> None:
        self.drivers = drivers
        self.job = job
        self.launches = 0
        self.handles: dict[int, tuple[str, object]] = {}
        self.pool = ThreadPoolExecutor(max_workers=8)

    def launch(self, hosts: list[str]) -> None:
        """Start every rank at once (one thread per rank, as the runner's actors do)."""
        self.launches += 1
        ports = _free_ports(len(hosts))
        peers = ",".join(f"127.0.0.1:{p}" for p in ports)

        def start(rank: int, host: str):
            env = {
                **self.job.env,
                "RANK": str(rank),
                "WORLD_SIZE": str(len(hosts)),
                "LOCAL_RANK": "0",
                "TESTBED_PEERS": peers,
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
            }
            handle = self.drivers[host].run_job(
                list(self.job.command),
                name=f"rank{rank}.{self.launches}",
                gpus=[0],
                env=env,
                workdir=f"testbed-jobs/rank{rank}",
            )
            return rank, host, handle

        for rank, host, handle in self.pool.map(lambda a: start(*a), enumerate(hosts)):
            self.handles[rank] = (host, handle)

    def first_step_after(self, rank: int, min_step: int | None = None) -> tuple[int, int]:
        """(monotonic ns, step) of the rank's first training step line (after its resume point, when
        min_step is None), as received from the host.
        """
        host, handle = self.handles[rank]
        floor = min_step
        for ev in self.drivers[host].watch(handle, heartbeat_s=0.05, progress=None, lines=None):
            if ev.kind == "exited":
                raise RuntimeError(f"rank {rank} on {host} exited before its first step (log {handle.log})")
            if ev.line is None:
                continue
            ready = re.search(READY, ev.line)
            if ready and floor is None:
                floor = int(ready.group(1)) + 1  # the runner waits for a step after the resume point too
                continue
            step = re.search(PROGRESS, ev.line)
            if step and floor is not None and int(step.group(1)) >= floor:
                return ev.monotonic_ns, int(step.group(1))
        raise RuntimeError(f"rank {rank}: the watch ended without a step")

    def stop(self) -> None:
        list(self.pool.map(lambda hh: self.drivers[hh[0]].stop_job(hh[1]), self.handles.values()))
        self.handles.clear()

    def close(self) -> None:
        self.pool.shutdown()
        for d in self.drivers.values():
            d.close()


def restart_alone(restarts: int) -> list[float]:
    """ms from the first launch command to the first step (after the resume) of the rank moved to a
    spare, `restarts` times; the job first runs past a checkpoint.
    """
    inv = load_inventory(INVENTORY).model
    return bare_restarts(inv, load_playbook(PLAYBOOK, inv).model.job, BareJob, restarts)


def bare_restarts(inv, job, bare_job: type[BareJob], restarts: int) -> list[float]:
    """The job launched by `bare_job` on the twin's hosts alone, run past a checkpoint, then `restarts` times
    relaunched with one rank on a spare: ms from the first launch command to that rank's first step.
    """
    ranks = list(job.ranks)
    spares = list(job.spares if job.spares is not None else inv.spares)
    with TwinProcess(twin_spec(inv, 0, only=set(ranks) | set(spares))) as twin:
        drivers = {h: _driver(h, twin.endpoints.devices[h]) for h in ranks + spares}
        bare = bare_job(drivers, job)
        try:
            bare.launch(ranks)
            bare.first_step_after(0, min_step=15)  # past the checkpoint at step 10, as the playbook's job.start
            bare.stop()
            out = []
            for t in range(restarts):
                hosts = list(ranks)
                failed = t % len(hosts)
                hosts[failed] = spares[t % len(spares)]
                start = time.monotonic_ns()
                bare.launch(hosts)
                first_ns, _ = bare.first_step_after(failed)
                out.append((first_ns - start) / 1e6)
                bare.stop()
            return out
        finally:
            bare.close()


# --- the benchmark ----------------------------------------------------------------------------------


def modelled_delays() -> dict:
    """The device delays the twin models on the failover's path, from the inventory and the playbook."""
    inv = load_inventory(INVENTORY).model
    pb = load_playbook(PLAYBOOK, inv).model
    switching = max(d.emulation.switching_time_ms for d in inv.devices.values() if d.kind == "ocs")
    heartbeat = next(s.heartbeat_ms for s in pb.steps if isinstance(s, Failover))
    return {"ocs_switching_ms": switching, "heartbeat_ms": heartbeat, "detection_ms": heartbeat / 2}


def ground_truth_figures(truths: list[dict | None]) -> dict | None:
    """The accuracy figure over every run that had one: the runs' own per-failover errors pooled."""
    errors, starts, ends = [], [], []
    for truth in truths:
        if not truth:
            continue
        rows = [r for r in truth.get("per_trial") or [] if r.get("error_ms") is not None]
        errors += [r["error_ms"] for r in rows]
        # Each end of the span on its own: the run folders are temporary, and these say where an outlier was.
        starts += [r["start_error_ms"] for r in rows]
        ends += [r["end_error_ms"] for r in rows]
    if errors:
        abs_err = [abs(e) for e in errors]
        # The priority the twin fired the faults at (testbed/results/accuracy.py): the figure depends on it.
        triggers = {t.get("trigger", "unknown") for t in truths if t}
        trigger = triggers.pop() if len(triggers) == 1 else "mixed"
        return {
            "n": len(errors),
            "error_ms": stats(errors),
            "abs_error_ms": stats(abs_err),
            "start_error_ms": stats(starts),
            "end_error_ms": stats(ends),
            "trigger": trigger,
        }
    # The summary's own statistics, if it gives no per-trial rows (one run only: they cannot be pooled).
    for truth in truths:
        if truth and isinstance(truth.get("error_ms"), dict):
            e = truth["error_ms"]
            return {
                "n": e.get("n", truth.get("trials")),
                "error_ms": {
                    "p50": e.get("p50", e.get("p50_ms")),
                    "p99": e.get("p99", e.get("p99_ms")),
                    "max": e.get("max", e.get("max_ms")),
                },
            }
    return None


def measure(trials: int = 10, restarts: int = 10, rounds: int = 3, console: Console | None = None) -> dict:
    console = console or Console()
    delays = modelled_delays()
    spans: dict[str, list[float]] = {}
    alone: list[float] = []
    truths = []
    runs = []
    failed_runs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        for r in range(rounds):
            try:
                fw = framework_failovers(trials, Path(tmp) / "results")
            except RuntimeError as exc:  # reported with the figures, and the round is run again once
                failed_runs.append(str(exc))
                console.print(f"[yellow]round {r + 1}: {exc}; running it again[/]")
                fw = framework_failovers(trials, Path(tmp) / "results")
            for name, values in fw["spans"].items():
                spans.setdefault(name, []).extend(values)
            truths.append(fw["ground_truth"])
            runs.append(fw["run_dir"])
            alone += restart_alone(restarts)
            console.print(
                f"round {r + 1}/{rounds}: failover.total p50 {np.median(spans['total']):.1f} ms, "
                f"restart alone p50 {np.median(alone):.1f} ms"
            )
    constant = delays["ocs_switching_ms"] + delays["detection_ms"]
    limit = [a + constant for a in alone]
    measured = spans["total"]
    result = {
        "rounds": rounds,
        "trials_per_round": trials,
        "restarts_per_round": restarts,
        "modelled_delays_ms": delays,
        "measured_total_ms": stats(measured),
        "segments_p50_ms": {k: float(np.median(v)) for k, v in spans.items()},
        "restart_alone_ms": stats(alone),
        "limit_ms": stats(limit),
        "ground_truth": ground_truth_figures(truths),
        "ground_truth_in_summary": any(bool(t) for t in truths),
        "failed_testbed_runs": failed_runs,
    }
    result["framework_share_p50_ms"] = result["measured_total_ms"]["p50"] - result["limit_ms"]["p50"]
    result["framework_share_p50_ms_full_heartbeat"] = result["framework_share_p50_ms"] - delays["detection_ms"]
    result["framework_share_fraction"] = result["framework_share_p50_ms"] / result["measured_total_ms"]["p50"]
    result["ratio_p50"] = result["measured_total_ms"]["p50"] / result["limit_ms"]["p50"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="failovers per testbed run")
    parser.add_argument("--restarts", type=int, default=10, help="bare restarts per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.trials, args.restarts, args.rounds, console)
    console.print(
        f"failover p50 {result['measured_total_ms']['p50']:.1f} ms against a physical limit of "
        f"{result['limit_ms']['p50']:.1f} ms (restart alone {result['restart_alone_ms']['p50']:.1f} ms); "
        f"framework share {result['framework_share_p50_ms']:.1f} ms ({100 * result['framework_share_fraction']:.0f} %)"
    )
    truth = result["ground_truth"]
    if truth:
        console.print(
            f"error against the twin's truth: p50 {truth['error_ms']['p50']:.2f} ms, "
            f"p99 {truth['error_ms']['p99']:.2f} ms"
        )
    else:
        console.print("ground truth: not available in this run's summary")
    write_out("failover", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
