"""In-job recovery against restart, for the real PyTorch job on the twin, side by side in one run.

    python bench/injob_failover.py [--trials 10] [--rounds 2] [--netns | --both]

Needs PyTorch (pip install 'testbed[torch]'); --netns also root and pyroute2 (docs/netns.md). Two playbooks, the same
job (testbed-torch-train over gloo, four ranks, one per host, a random rank's GPU lost, the spare swapped in over the
OCS):
- in-job: playbooks/torch-failover.yaml (`recovery: in-job`): a spare parked since job.start takes the failed slot
  in the next generation; nothing is started, no checkpoint read;
- restart: playbooks/torch-failover-restart.yaml (`recovery: restart`, under PyTorch's torchrun): every rank stopped
  and started again, resuming from the newest checkpoint.
In alternating rounds (the order turns every round), a `testbed run --emulate` of each with --trials failovers;
each failover's failover.total (fault_injected -> the spare's first step) and its segments. With --netns the runs
are `--emulate --netns`: the job's gloo traffic crosses the kernel's circuits (its data addresses are routed over
the job's ports only); --both measures on loopback and with --netns in the same rounds.

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
from testbed.lab import one_run_lab  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.steps.failover import Failover  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"
PLAYBOOKS = {
    "in-job": REPO / "playbooks/torch-failover.yaml",
    "restart": REPO / "playbooks/torch-failover-restart.yaml",
}
JOB_PART = ("ready", "first_step")  # the segments from the framework's last action to the spare's first step
PLANES = ("loopback", "netns")  # where the job's traffic goes: this machine's loopback, or the kernel's circuits
TARGET_P50_MS = 1000.0  # the issue's: fault -> the spare's first step, in-job
TARGET_SHARE = 0.10  # the issue's: the framework's share of it
HOW = """**In-job recovery against restart, the real PyTorch job** (`bench/injob_failover.py`, needs PyTorch; the
--netns rows root and pyroute2). `playbooks/torch-failover.yaml` (`recovery: in-job`: a spare parked since job.start
takes the failed slot in the job's next generation, the state broadcast from a survivor; nothing started) against
`playbooks/torch-failover-restart.yaml` (`recovery: restart` under PyTorch's torchrun: every rank stopped, started
again, resumed from the checkpoint), the same testbed-torch-train job (gloo, 4 ranks, gpu.fail on a random rank), a
`testbed run --emulate` of each per round, alternating, the order turning each round; with --netns the same runs with
`--emulate --netns`, the job's gloo traffic over the kernel's circuits. `failover.total` is fault_injected -> the
spare's first step. Framework share = p50 - (the job's own part: the `ready` + `first_step` segments' p50s) - the
OCS switching time - half the detection heartbeat."""


def skip_reason(plane: str) -> str | None:
    """Why this machine cannot measure on `plane`, or None."""
    if importlib.util.find_spec("torch") is None:
        return "the PyTorch job needs PyTorch: pip install 'testbed[torch]' (its CPU build is enough)"
    if plane == "netns":
        if os.geteuid() != 0:
            return "--netns needs root (network namespaces; run as root, as CI does)"
        if importlib.util.find_spec("pyroute2") is None:
            return "--netns needs pyroute2 (pip install 'testbed[netns]')"
    return None


def failovers(mode: str, trials: int, results: Path, netns: bool = False) -> dict:
    """One `testbed run --emulate` (with --netns: `--emulate --netns`) of the mode's playbook: each failover's
    segments (ms).
    """
    inv = load_inventory(INVENTORY).model
    plan = make_plan(load_playbook(PLAYBOOKS[mode], inv).model, inv, trials=trials)
    options = RunOptions(str(PLAYBOOKS[mode]), str(INVENTORY), results, emulate=True)
    with ray_session(None), one_run_lab(plan, options, quiet_console(), netns=netns) as lab:
        outcome = lab.run(plan, playbook_file=options.playbook_file, yes=True)
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


def measure(trials: int, rounds: int, console: Console, planes: tuple[str, ...] | list[str] = ("loopback",)) -> dict:
    """Both modes on each of `planes` (loopback, netns), in the same rounds; a plane this machine cannot measure on
    is skipped with the reason (no PyTorch at all: an error, as nothing can be measured).
    """
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("the PyTorch job needs PyTorch: pip install 'testbed[torch]' (its CPU build is enough)")
    unknown = [p for p in planes if p not in PLANES]
    if unknown:
        raise ValueError(f"no plane {unknown[0]!r}: the planes are {', '.join(PLANES)}")
    delays = modelled_delays()
    skipped = {p: why for p in planes if (why := skip_reason(p)) is not None}
    measured = [p for p in planes if p not in skipped]
    spans: dict[str, dict[str, dict[str, list[float]]]] = {p: {mode: {} for mode in PLAYBOOKS} for p in measured}
    for plane, why in skipped.items():
        console.print(f"[yellow]injob_failover on {plane} skipped: {why}[/]")
    with tempfile.TemporaryDirectory(prefix="bench-injob-failover-") as tmp:
        for r in range(rounds):
            for plane in measured:
                for mode in list(PLAYBOOKS) if r % 2 == 0 else reversed(PLAYBOOKS):
                    got = failovers(mode, trials, Path(tmp) / "results", netns=plane == "netns")
                    for name, values in got.items():
                        spans[plane][mode].setdefault(name, []).extend(values)
                    totals = spans[plane][mode]["total"]
                    console.print(
                        f"round {r + 1}/{rounds} {plane} {mode}: failover.total p50 {np.median(totals):.0f} ms "
                        f"(n={len(totals)})"
                    )
    result: dict = {"rounds": rounds, "trials_per_round": trials, "modelled_delays_ms": delays, "planes": {}}
    for plane in planes:
        if plane in skipped:
            result["planes"][plane] = {"skipped": skipped[plane]}
            continue
        modes = {mode: figures(spans[plane][mode], delays) for mode in PLAYBOOKS}
        ratio = modes["restart"]["total_ms"]["p50"] / modes["in-job"]["total_ms"]["p50"]
        result["planes"][plane] = {"modes": modes, "ratio_p50_restart_vs_in_job": ratio}
    return result


def rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    """bench/run_all.py's rows: in-job against restart on each plane, the framework's share, the segments."""
    out = []
    for plane, p in f["planes"].items():
        where = (
            "the twin" if plane == "loopback" else "the twin with --emulate --netns (gloo over the kernel's circuits)"
        )
        figure = f"The real PyTorch job on {where}, fault -> first step on the spare, in-job against restart"
        if "skipped" in p:
            out.append((figure, f"not measured: {p['skipped']}", "", "", "(report)", "n/a"))
            continue
        injob, restart = p["modes"]["in-job"], p["modes"]["restart"]
        t, b = injob["total_ms"], restart["total_ms"]
        out.append(
            (
                figure,
                f"in-job p50 {t['p50']:.0f} ms, p99 {t['p99']:.0f} ms, max {t['max']:.0f} ms (n={t['n']})",
                f"restart (torchrun, from the checkpoint): p50 {b['p50']:.0f} ms, p99 {b['p99']:.0f} ms (n={b['n']})",
                f"restart / in-job {p['ratio_p50_restart_vs_in_job']:.0f}x (p50s)",
                f"in-job p50 <= {TARGET_P50_MS:g} ms, n >= 20",
                "yes" if t["p50"] <= TARGET_P50_MS and t["n"] >= 20 else "**no**",
            )
        )
        share = injob["framework_share_fraction"]
        out.append(
            (
                "  the framework's share of it (p50 - the job's ready + first_step - OCS switching - half a heartbeat)",
                f"in-job {injob['framework_share_p50_ms']:.0f} ms ({100 * share:.0f} % of p50)",
                f"restart {restart['framework_share_p50_ms']:.0f} ms "
                f"({100 * restart['framework_share_fraction']:.0f} % of p50; its relaunch calls)",
                "",
                f"<= {100 * TARGET_SHARE:.0f} % of in-job's p50",
                "yes" if share <= TARGET_SHARE else "**no**",
            )
        )

        def segments(m: dict) -> str:
            return ", ".join(f"{k} {v:.0f}" for k, v in m["segments_p50_ms"].items() if k != "total")

        out.append(
            (
                "  segments (p50, ms)",
                f"in-job: {segments(injob)}",
                f"restart: {segments(restart)}",
                "",
                "(diagnosis)",
                "n/a",
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="failovers per testbed run")
    parser.add_argument("--rounds", type=int, default=2)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--netns", action="store_true", help="run with --emulate --netns (root)")
    where.add_argument("--both", action="store_true", help="on loopback and with --netns, in the same rounds")
    args = parser.parse_args()
    planes = PLANES if args.both else ("netns",) if args.netns else ("loopback",)
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.trials, args.rounds, console, planes)
    for plane, p in result["planes"].items():
        if "skipped" in p:
            console.print(f"{plane}: not measured: {p['skipped']}")
            continue
        for mode, f in p["modes"].items():
            console.print(
                f"{plane} {mode}: failover p50 {f['total_ms']['p50']:.0f} ms (n={f['total_ms']['n']}); segments p50 "
                + ", ".join(f"{k} {v:.0f}" for k, v in f["segments_p50_ms"].items() if k != "total")
                + f"; framework share {f['framework_share_p50_ms']:.0f} ms "
                f"({100 * f['framework_share_fraction']:.0f} %)"
            )
        console.print(f"{plane}: restart / in-job failover p50: {p['ratio_p50_restart_vs_in_job']:.1f}x")
    console.print(f"written: {write_out('injob_failover', result)}")
    return 0 if all("skipped" not in p for p in result["planes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
