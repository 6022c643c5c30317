"""Run every benchmark and write bench/RESULTS.md (raw figures in bench/out/*.json, git-ignored).

    python bench/run_all.py            # the full run (about 10 minutes on a 2-core machine)
    python bench/run_all.py --quick    # a small smoke configuration (a few minutes)

Every figure is a ratio against a baseline measured in the same run, in alternating rounds, because
machines here are noisy. Each benchmark is its own module (bench/*.py, runnable alone); this one only
runs them in order, times them, and renders the table. A benchmark that fails is reported as failed in
RESULTS.md (with its error) and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
import traceback
from pathlib import Path

import catalog_scale
import detect_zombie
import fabric_service
import failover
import health_fanout
import injob_failover
import netns_plane
import numpy as np
import ocs_overhead
import opus_runs
import opus_scale
import rail_hiding
import serve
import startup
import switch_protocols
import torch_failover
from benchlib import OUT, REPO, compile_project, machine, write_out
from rich.console import Console

FULL = {
    "detect_zombie": {"samples": 20},
    "startup": {"rounds": 5, "warm_runs": 10},
    "ocs_overhead": {"reconfigs": 300, "rounds": 3},
    "health_fanout": {"hosts": 64, "rounds": 3, "checks": 5},
    # 34 failovers a round: the accuracy's p99 is taken over 102 of them, not read off the maximum of 30.
    "failover": {"trials": 34, "restarts": 10, "rounds": 3},
    "opus_scale": {"trials": 10, "rounds": 3, "hosts": 256},
    "opus_runs": {"rounds": 2, "trials": 5},
    "switch_protocols": {"reconfigs": 90, "trials": 10, "rounds": 2},
    "fabric_service": {"rounds": 2, "iterations": 20},
    # Six sweep points of the 8-rank rail job a round, 10 iterations each (about 2 min a round on 2 cores).
    "rail_hiding": {"rounds": 2, "iterations": 10},
    # Each PyTorch launch is eight Pythons importing torch: a few failovers (about 4 min on a 2-core machine).
    "torch_failover": {"trials": 2, "restarts": 2, "rounds": 2},
    # In-job against restart, n = 20 of each per plane: each trial's job.start is six Pythons importing PyTorch, each
    # restart eight more (about 20 min a plane on a 2-core machine); --netns only as root, else skipped with why.
    "injob_failover": {"trials": 10, "rounds": 2, "planes": ["loopback", "netns"]},
    # A real 100-trial run (~18 s), 1,000 copies indexed (~60 s), three rounds of three queries (~2 min in all).
    "catalog_scale": {"runs": 1000, "rounds": 3},
    # 64-host health checks through a warm server, standalone and by Ansible; 21 queued runs; 1,000 runs on the page.
    "serve": {"hosts": 64, "rounds": 5, "queued": 20, "catalog": 1000},
    # --netns (root): throughput and circuit -> flow on the emulated rack (~1 min), 64-host start-ups, then the two
    # 256-host opus-2048 CLI runs with --netns.
    "netns_plane": {
        "mbytes": 200,
        "rounds": 5,
        "repeats": 20,
        "startup_hosts": 64,
        "startup_rounds": 3,
        "opus_trials": 3,
    },
}
QUICK = {
    "detect_zombie": {"samples": 5},
    "startup": {"rounds": 1, "warm_runs": 2},
    "ocs_overhead": {"reconfigs": 30, "rounds": 1},
    "health_fanout": {"hosts": 8, "rounds": 1, "checks": 2},
    "failover": {"trials": 2, "restarts": 2, "rounds": 1},
    "opus_scale": {"trials": 2, "rounds": 1, "hosts": 256},
    "opus_runs": {"rounds": 1, "trials": 1},
    "switch_protocols": {"reconfigs": 30, "trials": 2, "rounds": 1},
    "fabric_service": {"rounds": 1, "iterations": 4},
    "rail_hiding": {"rounds": 1, "iterations": 3},
    "torch_failover": {"trials": 1, "restarts": 1, "rounds": 1},
    "injob_failover": {"trials": 1, "rounds": 1, "planes": ["loopback", "netns"]},
    "catalog_scale": {"runs": 100, "rounds": 1},
    "serve": {"hosts": 8, "rounds": 1, "queued": 3, "catalog": 50},
    "netns_plane": {
        "mbytes": 20,
        "rounds": 1,
        "repeats": 2,
        "startup_hosts": 8,
        "startup_rounds": 1,
        "opus_runs": False,
    },
}
MODULES = {
    "startup": startup,
    "ocs_overhead": ocs_overhead,
    "health_fanout": health_fanout,
    "failover": failover,
    "opus_scale": opus_scale,
    "opus_runs": opus_runs,
    "switch_protocols": switch_protocols,
    "fabric_service": fabric_service,
    "rail_hiding": rail_hiding,
    "torch_failover": torch_failover,
    "injob_failover": injob_failover,
    "catalog_scale": catalog_scale,
    "serve": serve,
    "netns_plane": netns_plane,
    "detect_zombie": detect_zombie,
}


def run(names: list[str], config: dict, console: Console) -> dict:
    results = {}
    for name in names:
        console.rule(f"{name} {config[name]}")
        start = time.monotonic()
        try:
            figures = MODULES[name].measure(**config[name], console=console)
            results[name] = {"ok": True, "figures": figures}
            write_out(name, figures)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            console.print(f"[red]{name} failed: {type(exc).__name__}: {exc}[/]")
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        results[name]["seconds"] = time.monotonic() - start
        results[name]["config"] = config[name]
    return results


# --- RESULTS.md -------------------------------------------------------------------------------------


def _yes(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def _legs(truth: dict) -> str:
    """The worst of each end of the span, when the figures carry them: where an outlier of the error was."""
    start, end = truth.get("start_error_ms") or {}, truth.get("end_error_ms") or {}
    if "min" not in start or "max" not in end:
        return ""
    return f"; worst fault {-start['min']:.2f} ms after its moment, worst step line seen {end['max']:.2f} ms late"


def _ms(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f} ms"


def _s(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f} s"


def rows(results: dict) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, measured, baseline, ratio, target, met) for every figure of the issue."""
    out = []

    def failed(name: str, figure: str, target: str) -> None:
        err = " ".join(results[name].get("error", "not run").split())
        out.append((figure, f"failed: {err[:300]}", "", "", target, "**no**"))

    r = results.get("startup")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            wall, table, alone = f["cli_wall_s"], f["cli_table_s"], f["ray_alone_wall_s"]
            ph = f["cli_startup_phases_p50_s"]
            out.append(
                (
                    f"Start-up: `testbed run playbooks/{f['playbook']}`, cold, a fresh process: wall to exit",
                    f"p50 {_s(wall['p50'])} (max {_s(wall['max'])}, n={wall['n']}); the table at p50 "
                    f"{_s(table['p50'])}",
                    f"a fresh Python starting a local Ray as testbed does and shutting it down: p50 {_s(alone['p50'])}",
                    f"{f['ratio_cli_vs_ray_alone']:.2f}x",
                    "<= 6 s wall",
                    _yes(wall["p50"] <= 6.0),
                )
            )
            first = f["cli_first_command_s"]["p50"]
            out.append(
                (
                    "  where it goes (p50s; phases from run.json startup_s)",
                    f"first device command at {_s(first)}: Python, imports, loading and planning, then twin "
                    f"{_s(ph['twin'])} while Ray's head starts in a process of its own, Ray (what was left) "
                    f"{_s(ph['ray'])}, hubs "
                    f"{_s(ph['hubs'])}, clocks {_s(ph['clocks'])}, identify {_s(ph['identify'])}; the table at "
                    f"{_s(table['p50'])}; shutdown after it {_s(f['cli_shutdown_s']['p50'])}",
                    f"Ray alone: up after p50 {_s(f['ray_alone_up_s']['p50'])}",
                    "",
                    "(diagnosis)",
                    "n/a",
                )
            )
            if "ray_plain_up_s" in f:
                ours, plain = f["ray_alone_up_s"]["p50"], f["ray_plain_up_s"]["p50"]
                out.append(
                    (
                        "  Ray's start: a local instance as testbed starts it (testbed/engine/ray_local.py: its head "
                        "in a process of its own, without the API server and the two monitors, two fixed waits cut) "
                        "vs the same by a plain `ray.init`",
                        f"up after p50 {_s(ours)} (n={f['ray_alone_up_s']['n']})",
                        f"plain ray.init: up after p50 {_s(plain)} (n={f['ray_plain_up_s']['n']})",
                        f"{ours / plain:.2f}x",
                        "(diagnosis)",
                        "n/a",
                    )
                )
            w = f["warm"]
            out.append(
                (
                    "Warm session: `lab.run(...)` called -> the run's first device command (testbed.Lab, same "
                    "devices as the run before)",
                    f"p50 {_s(w['warm_s']['p50'], 3)}, max {_s(w['warm_s']['max'], 3)} (n={w['warm_s']['n']})",
                    f"the session's first run: {_s(w['first_run_s'])}",
                    f"{w['first_run_s'] / w['warm_s']['p50']:.0f}x sooner",
                    "<= 0.5 s",
                    _yes(w["warm_s"]["max"] <= 0.5),
                )
            )
        else:
            failed("startup", "Start-up: testbed run ocs-reconfig, cold", "<= 6 s wall")

    r = results.get("ocs_overhead")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            out.append(
                (
                    "OCS reconfiguration: framework overhead per reconfiguration",
                    f"p50 {_ms(f['overhead_p50_ms'], 2)} (p99 {_ms(f['overhead_p99_ms'], 2)}); "
                    f"cycle p50 {_ms(f['testbed_p50_ms'], 2)}, p99 {_ms(f['testbed_p99_ms'], 2)} (n={f['n_testbed']})",
                    f"raw socket script: cycle p50 {_ms(f['raw_p50_ms'], 2)}, p99 {_ms(f['raw_p99_ms'], 2)} "
                    f"(n={f['n_raw']})",
                    f"{f['ratio_p50']:.3f}x (cycle p50)",
                    "overhead <= 2 ms p50",
                    _yes(f["overhead_p50_ms"] <= 2.0),
                )
            )
        else:
            failed("ocs_overhead", "OCS reconfiguration: framework overhead", "<= 2 ms p50")

    r = results.get("health_fanout")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            n = f["hosts"]
            step = f["testbed_step_s"]
            if f["ansible"] is not None:
                best = f["ansible_best_warm"]
                a = f["ansible"]
                out.append(
                    (
                        f"Fan-out: health check of {n} emulated GPU hosts, testbed vs Ansible `raw` (best: -f "
                        f"{best['forks']}, connected)",
                        f"testbed health step p50 {_s(step['p50'], 3)}, p99 {_s(step['p99'], 3)} (n={step['n']})",
                        f"Ansible -f {best['forks']} warm p50 {_s(best['p50_s'])}",
                        f"{f['speedup_step_vs_ansible_warm']:.1f}x faster",
                        ">= 10x faster than Ansible",
                        _yes(f["speedup_step_vs_ansible_warm"] >= 10),
                    )
                )
                for forks in sorted({int(k[1:].split("_")[0]) for k in a}):
                    c, w = a[f"f{forks}_cold"], a[f"f{forks}_warm"]
                    out.append(
                        (
                            f"  Ansible `raw`, -f {forks}" + (" (default)" if forks == 5 else ""),
                            f"cold p50 {_s(c['p50'])} (max {_s(c['max'])}); warm p50 {_s(w['p50'])} "
                            f"(max {_s(w['max'])}); n={c['n']}",
                            "",
                            f"testbed step {w['p50'] / step['p50']:.1f}x faster than warm",
                            "",
                            "",
                        )
                    )
                best_cold = f["ansible_best_cold"]
                ansible_cold = f"Ansible -f {best_cold['forks']} cold p50 {_s(best_cold['p50_s'])}"
                lab, on = f["testbed_cold_on_lab_s"], f["testbed_cold_on_lab_cluster_s"]
                out.append(
                    (
                        "Command to table on the lab: `testbed run` (a fresh process, starting a local Ray) to the "
                        f"end of the first health step of {n} hosts that are up already, as Ansible's are",
                        f"testbed p50 {_s(lab['p50'], 2)} (max {_s(lab['max'], 2)}, n={lab['n']})",
                        ansible_cold,
                        f"{f['speedup_cold_on_lab_vs_ansible_cold']:.2f}x",
                        "faster than Ansible cold",
                        _yes(f["speedup_cold_on_lab_vs_ansible_cold"] > 1.0),
                    )
                )
                if "local_ray_and_hub_s" in f:
                    floor = f["local_ray_and_hub_s"]
                    out.append(
                        (
                            "  the floor under it: a fresh Python starting a local Ray as `testbed run` does, to one "
                            "device hub up (its process and modules, no device, no connection)",
                            f"p50 {_s(floor['p50'], 2)} (max {_s(floor['max'], 2)}, n={floor['n']}); left for {n} "
                            f"SSH connections and the check before Ansible is done: "
                            f"{_s(best_cold['p50_s'] - floor['p50'], 2)}",
                            ansible_cold,
                            f"{best_cold['p50_s'] / floor['p50']:.2f}x",
                            "(diagnosis)",
                            "n/a",
                        )
                    )
                out.append(
                    (
                        "  the same on a lab whose Ray cluster is up: `testbed run --ray-address` (or $RAY_ADDRESS), "
                        "a fresh process",
                        f"testbed p50 {_s(on['p50'], 2)} (max {_s(on['max'], 2)}, n={on['n']})",
                        ansible_cold,
                        f"{f['speedup_cold_on_lab_cluster_vs_ansible_cold']:.2f}x",
                        "faster than Ansible cold",
                        _yes(f["speedup_cold_on_lab_cluster_vs_ansible_cold"] > 1.0),
                    )
                )
                out.append(
                    (
                        "  the same emulated: `testbed run --emulate` (a fresh process starting its own twin of the "
                        f"{n} hosts and its own Ray, as on a laptop)",
                        f"testbed p50 {_s(f['testbed_cold_s']['p50'], 2)} (n={f['testbed_cold_s']['n']})",
                        ansible_cold,
                        f"{f['speedup_cold_vs_ansible_cold']:.2f}x",
                        "(reported)",
                        "n/a",
                    )
                )
                out.append(
                    (
                        f"  the same in a warm session: `lab.run(gpu-health)` called -> end of its health step of {n} "
                        "hosts (testbed.Lab, one run before)",
                        f"p50 {_s(f['testbed_warm_session_s']['p50'], 3)} (n={f['testbed_warm_session_s']['n']})",
                        ansible_cold,
                        f"{f['speedup_warm_session_vs_ansible_cold']:.1f}x faster",
                        "(reported)",
                        "n/a",
                    )
                )
            else:
                out.append(
                    (
                        f"Fan-out: {n} hosts vs Ansible",
                        f"testbed health step p50 {_s(step['p50'], 3)}",
                        f"not measured: {f['ansible_missing']}",
                        "",
                        ">= 10x faster than Ansible",
                        "**no**",
                    )
                )
            seq = f["sequential_s"]
            out.append(
                (
                    f"Fan-out: {n} hosts, testbed vs a sequential paramiko loop",
                    f"testbed health step p50 {_s(step['p50'], 3)}",
                    f"sequential paramiko p50 {_s(seq['p50'])} (n={seq['n']})",
                    f"{f['speedup_step_vs_sequential']:.1f}x faster",
                    "(reported)",
                    "n/a",
                )
            )
            par = f.get("parallel_paramiko_connected_s") or {}
            if par.get("n"):
                out.append(
                    (
                        "  diagnosis: the same check from one process, a thread and an open paramiko connection "
                        "per host, no Ray",
                        f"p50 {_s(par['p50'], 3)}, p99 {_s(par['p99'], 3)} (n={par['n']})",
                        f"testbed health step p50 {_s(step['p50'], 3)}",
                        f"testbed / this: {step['p50'] / par['p50']:.2f}x",
                        "(diagnosis)",
                        "n/a",
                    )
                )
        else:
            failed("health_fanout", "Fan-out: health check vs Ansible", ">= 10x faster than Ansible")

    r = results.get("failover")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            m, lim, d = f["measured_total_ms"], f["limit_ms"], f["modelled_delays_ms"]
            out.append(
                (
                    "Failover: measured latency vs the physical limit",
                    f"p50 {_ms(m['p50'])}, p99 {_ms(m['p99'])} (n={m['n']})",
                    f"limit p50 {_ms(lim['p50'])}, p99 {_ms(lim['p99'])}: OCS {d['ocs_switching_ms']:g} ms + "
                    f"detection {d['detection_ms']:g} ms (half the {d['heartbeat_ms']:g} ms heartbeat) + restart "
                    f"alone p50 {_ms(f['restart_alone_ms']['p50'])} (n={f['restart_alone_ms']['n']})",
                    f"{f['ratio_p50']:.2f}x; framework share {_ms(f['framework_share_p50_ms'])} "
                    f"({100 * f['framework_share_fraction']:.0f} % of p50; "
                    f"{_ms(f['framework_share_p50_ms_full_heartbeat'])} counting the whole heartbeat)",
                    "(report the framework's share)",
                    "n/a",
                )
            )
            seg = f["segments_p50_ms"]
            out.append(
                (
                    "  where the measured failover goes (p50 of each segment)",
                    ", ".join(f"{k} {v:.0f} ms" for k, v in seg.items() if k != "total"),
                    f"restart alone p50 {_ms(f['restart_alone_ms']['p50'])} (launch -> first step)",
                    "",
                    "(diagnosis)",
                    "n/a",
                )
            )
            truth = f["ground_truth"]
            if truth:
                e = truth["error_ms"]
                out.append(
                    (
                        "Measurement accuracy: measured failover vs the twin's ground truth",
                        f"error p99 {_ms(e['p99'], 2)}, p50 {_ms(e['p50'], 2)}, max {_ms(e['max'], 2)} "
                        f"(n={truth['n']}; error = measured - truth; faults fired at "
                        f"{truth.get('trigger', 'unknown')} priority){_legs(truth)}",
                        "the twin's own record of fault and first step",
                        "",
                        "(report p99 error)",
                        "n/a",
                    )
                )
            else:
                out.append(
                    (
                        "Measurement accuracy: measured failover vs the twin's ground truth",
                        "not available (the run's summary.json has no ground_truth)",
                        "",
                        "",
                        "(report p99 error)",
                        "n/a",
                    )
                )
        else:
            failed("failover", "Failover vs physical limit (and accuracy)", "(report)")

    r = results.get("torch_failover")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            t, b = f["jobs"]["torch"], f["jobs"]["train"]

            def job(j: dict) -> str:
                m = j["measured_total_ms"]
                return (
                    f"p50 {_ms(m['p50'], 0)} (max {_ms(m['max'], 0)}, n={m['n']}); framework share "
                    f"{_ms(j['framework_share_p50_ms'], 0)} ({100 * j['framework_share_fraction']:.0f} % of p50) over "
                    f"a restart alone of p50 {_ms(j['restart_alone_ms']['p50'], 0)} (n={j['restart_alone_ms']['n']})"
                )

            out.append(
                (
                    "Failover of a real PyTorch job: `playbooks/torch-failover-restart.yaml` (testbed-torch-train, "
                    "DistributedDataParallel over gloo, PyTorch's torchrun) vs the same playbook running testbed-train",
                    f"PyTorch job {job(t)}",
                    f"testbed-train {job(b)}",
                    f"{f['ratio_p50_torch_vs_train']:.2f}x (p50s)",
                    "(report the framework's share of each)",
                    "n/a",
                )
            )
            out.append(
                (
                    "  where each failover goes (p50 of each segment)",
                    "PyTorch job: "
                    + ", ".join(f"{k} {v:.0f} ms" for k, v in t["segments_p50_ms"].items() if k != "total"),
                    "testbed-train: "
                    + ", ".join(f"{k} {v:.0f} ms" for k, v in b["segments_p50_ms"].items() if k != "total"),
                    "",
                    "(diagnosis)",
                    "n/a",
                )
            )
        else:
            failed("torch_failover", "Failover of a real PyTorch job vs testbed-train", "(report)")

    r = results.get("opus_scale")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            a, o = f["all_switches_ms"], f["one_switch_ms"]
            out.append(
                (
                    f"Opus scale ({f['gpus']} GPUs, {f['rails']} rails of {f['ports']}-port OCSes): one rail "
                    f"reconfiguration ({f['circuits_per_switch']} circuits per switch) on all switches at once",
                    f"{f['rails']} switches p50 {_ms(a['p50'])}, p99 {_ms(a['p99'])} (n={a['n']})",
                    f"one switch alone p50 {_ms(o['p50'])}, p99 {_ms(o['p99'])} (n={o['n']})",
                    f"{f['ratio_p50']:.2f}x (medians)",
                    "<= 1.5x",
                    _yes(f["ratio_p50"] <= 1.5),
                )
            )
            if f.get("raw_all_switches_ms", {}).get("n"):
                ra, ro = f["raw_all_switches_ms"], f["raw_one_switch_ms"]
                out.append(
                    (
                        "  diagnosis: the same changes by a raw-socket script (no framework), 8 switches vs 1",
                        f"{f['rails']} switches p50 {_ms(ra['p50'])}, p99 {_ms(ra['p99'])} (n={ra['n']})",
                        f"one switch p50 {_ms(ro['p50'])}, p99 {_ms(ro['p99'])} (n={ro['n']})",
                        f"{f['raw_ratio_p50']:.2f}x (medians)",
                        "(diagnosis)",
                        "n/a",
                    )
                )
            t = f["twin_memory"]
            out.append(
                (
                    "Opus scale: twin memory per emulated device",
                    f"{t['per_device_kib']:.0f} KiB per device ({t['full']['devices']} devices: twin RSS "
                    f"{t['full']['rss_kib'] / 1024:.0f} MiB, started in {t['full']['start_s']:.1f} s); a host's "
                    f"marginal cost {t['per_host_marginal_kib']:.0f} KiB",
                    f"empty twin RSS {t['empty']['rss_kib'] / 1024:.0f} MiB",
                    "",
                    "(report)",
                    "n/a",
                )
            )
            act = f["device_actor_memory"]
            if act.get("rss_mib_p50"):
                hosts_act = (results.get("health_fanout") or {}).get("figures", {}).get("host_actor_memory") or {}
                host_part = (
                    f"; the {hosts_act['devices']} GPU hosts' hub {hosts_act['rss_mib_p50']:.0f} MiB RSS / "
                    f"{hosts_act['pss_mib_p50']:.0f} MiB PSS: {hosts_act['pss_mib_per_device']:.1f} MiB PSS per device"
                    if hosts_act.get("pss_mib_per_device")
                    else ""
                )
                out.append(
                    (
                        "Opus scale: controller memory (device hubs, one Ray actor per node)",
                        f"the {act['devices']} switches: {act['actors_seen']} hub process(es) of "
                        f"{act['rss_mib_p50']:.0f} MiB RSS / {act['pss_mib_p50']:.0f} MiB PSS each (a switch has a "
                        f"process of its own): {act['pss_mib_per_device']:.1f} MiB PSS per switch{host_part}",
                        "one Ray actor per device (before the hubs): 60-64 MiB PSS per device",
                        "",
                        "(report)",
                        "n/a",
                    )
                )
        else:
            failed("opus_scale", "Opus scale", "<= 1.5x")

    r = results.get("opus_runs")
    if r is not None:
        if r["ok"]:
            f = r["figures"]

            def tree(peak: dict) -> str:
                g = peak["groups"]
                parts = ", ".join(f"{k} {g[k]['pss_mib']:.0f}" for k in ("controller", "ray", "twin") if k in g)
                return f"{peak['pss_mib']:.0f} MiB PSS ({parts})"

            def startup(s: dict | None) -> str:
                keys = ("twin", "ray", "hubs", "identify")
                return ", ".join(f"{k} {s[k]:.1f} s" for k in keys if s and k in s) or "n/a"

            h, fo = f["health"], f["failover"]
            out.append(
                (
                    f"Opus runs ({f['hosts']} hosts x 8 GPUs): `{h['command'].split(' --results')[0]}`, cold, "
                    "command start to exit",
                    f"{_s(h['wall_s']['p50'], 1)} (max {_s(h['wall_s']['max'], 1)}, n={h['wall_s']['n']}); "
                    f"start-up {startup(h['startup_s'])}; health step p50 {_ms(h['health_step_ms'].get('p50'), 0)}",
                    "",
                    "",
                    "completes (report)",
                    "yes",
                )
            )
            ft = fo["failover_total_p50_ms"]
            out.append(
                (
                    f"Opus runs: `{fo['command'].split(' --results')[0]}` (8 ranks), cold",
                    f"{_s(fo['wall_s']['p50'], 1)} (max {_s(fo['wall_s']['max'], 1)}, n={fo['wall_s']['n']}); "
                    f"failover.total p50 {_ms(ft.get('p50'), 0)} (a run's p50, median over runs)",
                    "",
                    "",
                    "completes (report)",
                    "yes",
                )
            )
            out.append(
                (
                    "Opus runs: peak memory of the whole process tree (testbed, Ray, hubs, twin; every "
                    f"{f['sample_every_s']:g} s)",
                    f"health {tree(h['peak_pss'])}, RSS sum {h['peak_rss']['rss_mib']:.0f} MiB; failover "
                    f"{tree(fo['peak_pss'])}, RSS sum {fo['peak_rss']['rss_mib']:.0f} MiB",
                    "",
                    "",
                    "(report)",
                    "n/a",
                )
            )
            c = f["controller_memory"]
            full = float(np.median([x["pss_mib"] for x in c["full_controller"]]))
            base = float(np.median([x["pss_mib"] for x in c["base_controller"]]))
            hubs = max(x["processes"] for x in c["full_controller"]) - 1
            per = c["pss_mib_per_device"]
            out.append(
                (
                    f"Opus runs: controller memory per device ({c['full_devices']} devices driven: health of every "
                    "host, a permutation on every rail)",
                    f"{per['p50']:.2f} MiB PSS per device (n={per['n']}): (testbed + {hubs} hub processes "
                    f"{full:.0f} MiB - base {base:.0f} MiB) / {c['full_devices']}; the twin "
                    f"{np.median([x['pss_mib'] for x in c['full_twin']]):.0f} MiB PSS, not counted (medians of "
                    f"{per['n']} pairs of runs)",
                    f"base: the same on 1 host + 1 switch, {base:.0f} MiB PSS (twin "
                    f"{np.median([x['pss_mib'] for x in c['base_twin']]):.0f} MiB)",
                    "",
                    "<= 5 MiB per device",
                    _yes(per["max"] <= 5.0),
                )
            )
        else:
            failed("opus_runs", "Opus runs: gpu-health and gpu-failover at 2048 GPUs, memory", "completes")

    r = results.get("switch_protocols")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            protocols = f["protocols"]
            for p in protocols.values():
                raw, tb = p["raw_cycle_ms"], p["testbed_cycle_ms"]
                out.append(
                    (
                        f"OCS protocols: reconfiguration overhead, {p['label']} (`{p['driver']}`)",
                        f"p50 {_ms(p['overhead_p50_ms'], 2)} (p99 {_ms(p['overhead_p99_ms'], 2)}); testbed cycle p50 "
                        f"{_ms(tb['p50'], 2)}, p99 {_ms(tb['p99'], 2)} (n={tb['n']})",
                        f"{p['raw_client']}: cycle p50 {_ms(raw['p50'], 2)}, p99 {_ms(raw['p99'], 2)} (n={raw['n']})",
                        f"{p['ratio_p50']:.3f}x (cycle p50)",
                        "(report)",
                        "n/a",
                    )
                )
            base = protocols[f["baseline"]]
            for name, p in protocols.items():
                total = p["failover_total_ms"]
                is_base = name == f["baseline"]
                ci = p["failover_ratio_to_scpi_ci95"]
                out.append(
                    (
                        f"OCS protocols: failover p50, {p['label']}"
                        + (" (the baseline)" if is_base else f" vs {base['label']}"),
                        f"p50 {_ms(total['p50'])}, p99 {_ms(total['p99'])} (n={total['n']})",
                        "(the baseline)"
                        if is_base
                        else f"{base['label']} p50 {_ms(base['failover_total_ms']['p50'])} "
                        f"(n={base['failover_total_ms']['n']})",
                        f"{p['failover_ratio_to_scpi_p50']:.3f}x"
                        + (f" (bootstrap 95 %: {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""),
                        "(baseline)" if is_base else f"within 10 % of {base['label']} (<= 1.10x)",
                        "n/a" if is_base else _yes(p["failover_within_10pct_of_scpi"]),
                    )
                )
            out.append(
                (
                    "  where the protocols differ in a failover: its reconfigure and verify segments (p50)",
                    "; ".join(
                        f"{p['label']} {p['failover_segments_p50_ms'].get('reconfigure', float('nan')):.0f} + "
                        f"{p['failover_segments_p50_ms'].get('verify', float('nan')):.0f} ms"
                        for p in protocols.values()
                    ),
                    "the job's restart (relaunch + ready): "
                    + "; ".join(
                        f"{p['label']} {seg.get('relaunch', 0.0) + seg.get('ready', 0.0):.0f} ms"
                        for p in protocols.values()
                        for seg in [p["failover_segments_p50_ms"]]
                    ),
                    "",
                    "(diagnosis)",
                    "n/a",
                )
            )
        else:
            failed("switch_protocols", "OCS protocols: reconfiguration overhead and failover", "within 10 % of SCPI")

    r = results.get("fabric_service")
    if r is not None:
        if r["ok"]:
            f = r["figures"]
            cmd, ans, base = f["command"], f["answer"], f["apply"]
            out.append(
                (
                    "Fabric service: framework time per job request, request received -> switch command sent",
                    f"p50 {_ms(cmd['p50'], 2)}, p99 {_ms(cmd['p99'], 2)} (n={cmd['n']} changes)",
                    f"a fabric.apply step to the same switch, invoke recorded -> command sent: p50 "
                    f"{_ms(base['p50'], 2)} (n={base['n']})",
                    f"{f['ratio_command_vs_apply_p50']:.2f}x",
                    "<= 1 ms p50",
                    _yes(cmd["p50"] <= 1.0),
                )
            )
            out.append(
                (
                    "Fabric service: framework time per job request, light verified -> answer sent",
                    f"p50 {_ms(ans['p50'], 2)}, p99 {_ms(ans['p99'], 2)} (n={ans['n']} answers)",
                    "",
                    "",
                    "<= 1 ms p50",
                    _yes(ans["p50"] <= 1.0),
                )
            )
        else:
            failed("fabric_service", "Fabric service: framework time per job request", "<= 1 ms p50 each")

    for name, (rows_of, what, target) in ROWS_OF.items():
        r = results.get(name)
        if r is not None:
            if r["ok"]:
                out.extend(rows_of(r["figures"]))
            else:
                failed(name, what, target)
    return out


def _catalog_rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    q, n = f["query_p50_s"], f["runs"]
    one = f["index_one_run_s"]["p50"]
    return [
        (
            f"Catalog: a trend query over {n:,} runs of {f['trials']} trials ({f['span']}'s median run by run, "
            f"{f['samples']:,} samples)",
            f"span_columns (as trend reads it) + medians {_s(q['catalog'])}; "
            f"testbed.runs() + groupby {_s(q['dataframe'])}",
            f"pandas over the folders (run.json + trials.csv each) {_s(q['pandas'])}",
            f"{f['ratio_catalog_vs_pandas']:.2f}x (testbed.runs(): {f['ratio_dataframe_vs_pandas']:.2f}x)",
            "< 1 s",
            _yes(q["catalog"] < 1.0),
        ),
        (
            f"Catalog: indexing {n:,} runs of {f['trials']} trials; its size on disk",
            f"{f['index_all_s']:.1f} s ({f['index_per_run_ms']:.0f} ms a run); catalog "
            f"{f['catalog_bytes'] / 2**20:.0f} MiB",
            f"the run folders {f['folder_bytes'] / 2**20:.0f} MiB",
            f"{f['catalog_bytes'] / f['folder_bytes']:.3f}x (size)",
            "(report)",
            "n/a",
        ),
        (
            "Catalog: indexing one run's share of its `testbed run` command",
            f"index_run {one * 1000:.0f} ms (p50 of {f['index_one_run_s']['n']}, into the catalog of {n:,} runs)",
            f"`testbed run playbooks/ocs-reconfig.yaml --emulate --trials {f['trials']}`: {_s(f['command_s'], 1)}",
            f"{100 * f['index_share']:.1f} %",
            "< 5 %",
            _yes(f["index_share"] < 0.05),
        ),
    ]


def _rail_hiding_rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    def point(mode: str, delay: int) -> str:
        p = f["points"][f"{mode}@{delay}"]
        return f"{mode} p50 {_ms(p['time']['p50'], 0)} (stall {_ms(p['stall']['p50'], 0)}, n={p['time']['n']})"

    small, large = f["small"], f["large"]
    return [
        (
            f"Rail train: provisioning hides a {small['delay_ms']} ms OCS delay behind the compute (8 ranks, "
            "iteration time)",
            f"{point('provisioning', small['delay_ms'])}: hides {_ms(small['provisioning_hides_ms'], 0)} of "
            f"on-demand's {_ms(small['on_demand_pays_ms'], 0)} over static",
            f"{point('on-demand', small['delay_ms'])}; {point('static', small['delay_ms'])}",
            f"{small['provisioning_hides_ms'] / small['on_demand_pays_ms']:.2f} of it hidden",
            f">= {f['hides_target_ms']:g} ms hidden (both changes' switching)",
            _yes(small["provisioning_hides_ms"] >= f["hides_target_ms"]),
        ),
        (
            f"  a {large['delay_ms']} ms delay overruns the compute: both pay",
            f"{point('provisioning', large['delay_ms'])}: pays {_ms(large['provisioning_pays_ms'], 0)} over static",
            f"{point('on-demand', large['delay_ms'])}: pays {_ms(large['on_demand_pays_ms'], 0)}",
            "",
            "(report)",
            "n/a",
        ),
    ]


def _netns_rows(f: dict) -> list[tuple[str, str, str, str, str, str]]:
    if "skipped" in f:
        return [("--netns kernel data plane", f"not measured: {f['skipped']}", "", "", "(report)", "n/a")]
    t, flow, s = f["throughput"], f["to_flow"], f["startup"]

    def ms(d: dict, digits: int = 1) -> str:
        return f"p50 {_ms(d['p50'], digits)}, p90 {_ms(d['p90'], digits)}"

    out = [
        (
            f"--netns: TCP throughput host to host over one circuit (gpu01:p0 -> gpu02:p1 through ocs1, one "
            f"connection of {t['mbytes_per_connection']} MB)",
            f"p50 {t['circuit_mb_s_p50']:.0f} MB/s (min {t['circuit_mb_s']['min']:.0f}, n={t['circuit_mb_s']['n']})",
            f"a bare veth pair between two namespaces: p50 {t['veth_mb_s_p50']:.0f} MB/s (n={t['veth_mb_s']['n']})",
            f"{t['ratio_circuit_vs_veth']:.2f}x",
            "(report)",
            "n/a",
        ),
        (
            f"--netns: circuit ADD sent -> first echo back (UDP every {flow['send_every_ms']:g} ms; "
            f"{flow['switching_ms']:g} ms switching)",
            f"{ms(flow['flow_ms'])} (n={flow['flow_ms']['n']}); after `*OPC?` {ms(flow['after_opc_ms'])}",
            f"`*OPC?` answered {ms(flow['opc_ms'])}",
            "",
            "(report)",
            "n/a",
        ),
        (
            "  the kernel's own events: the twin's tick saw the light -> the tc filter applied; `*OPC?` -> seen",
            f"seen -> applied {ms(flow['seen_to_applied_ms'], 2)} (n={flow['seen_to_applied_ms']['n']} directions); "
            f"`*OPC?` -> seen {ms(flow['opc_to_seen_ms'], 2)} (tick {flow['tick_ms']:g} ms)",
            "",
            "",
            "(diagnosis)",
            "n/a",
        ),
        (
            f"--netns: twin start-up to ready, {s['hosts']} GPU hosts ({s['host_ports']} host ports, "
            f"{s['devices']} devices)",
            f"netns p50 {_s(s['netns_ready_s']['p50'])} (max {_s(s['netns_ready_s']['max'])}, "
            f"n={s['netns_ready_s']['n']}); its stop {_s(s['netns_stop_s']['p50'])}",
            f"loopback p50 {_s(s['loopback_ready_s']['p50'])} (n={s['loopback_ready_s']['n']})",
            f"{s['ratio_netns_vs_loopback']:.2f}x",
            "(report)",
            "n/a",
        ),
    ]
    for run in (f.get("opus") or {}).values():
        mem = run["memory"]
        out.append(
            (
                f"--netns at Opus scale: `{run['command']}`, cold, command to exit",
                f"{_s(run['wall_s'], 1)}, exit {run['exit_status']}, status {run['status']}; peak tree PSS "
                f"{mem['peak_pss']['pss_mib']:.0f} MiB, RSS sum {mem['peak_rss']['rss_mib']:.0f} MiB; MemAvailable "
                f"drop {run['mem_available_drop_mib']:.0f} MiB"
                + (
                    f"; {run.get('error') or ' '.join((run['output_tail'] or '').split()[-12:])}"
                    if not run["completed"]
                    else ""
                ),
                "",
                "",
                "completes",
                _yes(run["completed"]),
            )
        )
    return out


HOW = {
    "startup": """**Start-up** (`bench/startup.py`). Cold: `testbed run playbooks/ocs-reconfig.yaml --emulate
--trials 1` (three reconfigurations of the emulated switch) started as a subprocess, as a user types it: wall
time to its exit, to its first device command (its first `invoke` event) and to the table (the `results:` line, printed
before the shutdown); run.json `startup_s` gives the phases. Baselines, the order turning by round: a fresh
Python that starts a local Ray instance exactly as testbed does (`ray_session`) and shuts it down; and the same
instance started by a plain `ray.init` (the same bounds, loopback, no dashboard) in the same process, which
starts every head process and keeps the two fixed waits that `testbed/engine/ray_local.py` leaves out and cuts.
Warm: one
`testbed.Lab(emulate=True)` in the benchmark's process, a first `lab.run` of the same playbook, then more runs;
for each, from calling `lab.run` to its first `invoke` event (both on this machine's CLOCK_MONOTONIC).""",
    "ocs_overhead": """**OCS overhead** (`bench/ocs_overhead.py`). One emulated 32x32 switch (25 ms switching
time, jitter 0) is cycled through the three configurations of `playbooks/ocs-reconfig.yaml`, by `testbed run`
(Ray actor, driver error checks, read-back, light verification, event recording) and by a minimal raw-socket
script (SUB / ADD / `*OPC?` / `PMON:POW?` polling), in alternating rounds. A reconfiguration's cycle is the
interval between the first commands of consecutive reconfigurations; overhead = testbed cycle - raw cycle at the
same percentile.""",
    "health_fanout": """**Fan-out** (`bench/health_fanout.py`). The same health commands on every host:
`GpuHostSsh.health()`'s `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` and `dmesg`. testbed:
`playbooks/gpu-health.yaml` (one hub actor for all the hosts, a thread each, all at once), its `health.wall` span
per health step; the hosts are connected by then. Command to table: `testbed run` started as a subprocess, to the
end of its first health step. On the lab: the hosts are up already, as Ansible's are (the same running twin,
reached through an inventory of its addresses, keys and known_hosts, without `--emulate`: a lab run, with its
leases, locks and host key checks), the command starting its own local Ray; on the lab with its cluster: the same
command with `--ray-address` of a one-node Ray cluster started before the rounds (how a lab runs testbed across
control hosts: its Ray cluster is part of the lab, up before any command, so its start is not counted); the two
alternate which goes first by round. The floor under a command that starts its own Ray, in the same rounds: a fresh
Python that starts a local Ray as `testbed run` does and places one empty device hub (`RAY_AND_HUB`), to the hub
up. Emulated: `--emulate`, the command starting its own twin and its own Ray, as on a laptop. Warm session: in
a `testbed.Lab` that has run once, `lab.run` called -> the end of the health step.
Ansible: `ansible all -i INV -m raw -a '<the commands>' -f FORKS -o` over an
inventory generated from the twin's endpoints (port, user, key file), host keys checked against the twin's
known_hosts with `StrictHostKeyChecking=yes`; "cold" with a fresh ControlPath directory (OpenSSH connects and
authenticates every host), "warm" right after it, over the ControlPersist masters (connected, like the actors).
The target compares testbed's step with the best warm Ansible figure. The emulated SSH server accepts the pty
that `ansible raw` requests (`ssh -tt`). Sequential: paramiko, connect / check / close host after host. Rounds
alternate testbed, sequential and Ansible (the forks order alternates too).""",
    "failover": """**Failover** (`bench/failover.py`). `testbed run playbooks/gpu-failover.yaml --emulate`: a
4-rank `testbed-train` job, a GPU falls off the bus (Xid 79), detection, spare, OCS rewiring, relaunch from the
checkpoint; failover.total = fault injected -> the spare's first step. Physical limit per trial = the
inventory's OCS switching time (25 ms) + half the playbook's 50 ms detection heartbeat (the emulated host's
`tail --pid` notices a dead rank on average half a heartbeat later) + the job's own restart measured alone: the
same `run_job` calls over SSH with no framework around them, all ranks at once, the failed rank on a spare, from
the first launch command to the spare's first step line after its resume point. Teardown of the surviving ranks
and the light check are not in the limit; their cost is part of the framework's share = measured p50 - limit
p50. Framework runs and bare restarts alternate by round. Accuracy: each run's summary.json `ground_truth` (the
twin's own record of when it applied the fault and when the spare's rank wrote the step line taken as
first_step), error = measured - truth, pooled over the runs. The framework's fault_injected is the moment the
twin was told to apply the fault (a timed trigger) and its first_step the kernel's receive stamp of the packet
that carried the step line; the twin records what really happened, so its lateness and the SSH hop are in
the error. The twin fires faults at real-time priority where the run may (root, CAP_SYS_NICE or an rtprio
limit) and at normal priority otherwise; the row says which.""",
    "opus_scale": """**Opus scale** (`bench/opus_scale.py`). The inventory
`playbooks/inventory/opus-2048.yaml`: 256 hosts x 8 GPUs with ports r0..r7, rail k a 256-port OCS
(switching 25 ms, jitter 0) cabled to every host's rk. A playbook applies
two full permutations of 256 circuits alternately (every circuit moves each time); the run's `rail.total` span
is first command sent -> every new egress lit on the last switch. All 8 switches at once (one actor each, as
`testbed run` always does) against the same playbook on one switch, alternating by round; ratio of medians.
Diagnosis, in the same rounds: a raw-socket script (one thread per switch, released together: SUB, ADD, `*OPC?`,
`PMON:POW?` until lit) doing the same changes on 8 switches and on 1, with no framework. Memory: the twin
process's VmRSS after start-up with everything (256 hosts with their SSH servers, 8 switches, 2048 fibres) minus
an empty twin's, per device; a host's marginal cost from 256 hosts minus 128. Actors: peak VmRSS and Pss (shared
pages split among sharers) of each `ray::DeviceHub` process of this run, sampled every second, and their PSS
divided by the devices they serve (the 8 switches here, each in a hub of its own; the 64 hosts in the fan-out run,
all in one hub).""",
    "opus_runs": """**Opus runs** (`bench/opus_runs.py`). The 2048-GPU inventory
`playbooks/inventory/opus-2048.yaml` through the real CLI: each run is `testbed run ... --inventory
playbooks/inventory/opus-2048.yaml --emulate` started as a subprocess (cold: its own Ray instance, twin and hubs),
timed from starting the command to its exit. Per round, one after the other: `playbooks/gpu-health.yaml --trials 1`
(all 256 hosts; start-up phases from run.json `startup_s`, identify = connecting to every host); the 8-rank failover
`playbooks/opus-failover.yaml` (h001..h008 on a 2 x 4 torus, rail 0 along rows and rail 1 along columns; spares
h249..h256); and two runs of a generated playbook (hosts.health, then a 256-circuit permutation by fabric.apply,
two trials, then fabric.clear) on all 264 devices and on 1 host + 1 switch. Memory: the command's process tree
sampled every 0.5 s, Pss (/proc/PID/smaps_rollup) and VmRSS summed per sample; the peak is the largest sum.
Controller = the `testbed` process + the `ray::DeviceHub` workers (one for all the hosts, one per switch); twin =
`python -m emulators serve` and its children (the job's ranks); Ray = the rest (GCS, raylet, agents, idle
workers). Per device = (controller PSS peak with 264 devices - with 2) / 264.""",
    "switch_protocols": """**OCS protocols** (`bench/switch_protocols.py`). The same emulated 32x32 switch behind
each of its four drivers, chosen by the inventory: `emulated-rack.yaml` (`polatis-scpi`), `emulated-rack-netconf.yaml`
(`polatis-netconf`: ncclient over SSH), `emulated-rack-tl1.yaml` (`polatis-tl1`) and `emulated-rack-calient.yaml`
(`calient-tl1`). Reconfiguration: as for **OCS overhead** (`playbooks/ocs-reconfig.yaml`, 25 ms switching, jitter 0,
the cycle between consecutive `sent` marks), against a raw client of the same protocol doing the same cycle of
configurations with nothing of the project on its side: SCPI, the raw-socket script of `bench/ocs_overhead.py`;
NETCONF, plain ncclient (host key pinned from the twin's known_hosts, the twin's client key), one edit-config of the
deletes and merges on `running`, then `get` of `opm-power` until lit (NETCONF has no `*OPC?`); Polatis TL1, a plain
socket: `ACT-USER`, `DLT-PATCH` and `ENT-PATCH` in one write (COMPLD comes once the mirrors have settled), then
`RTRV-PORT-POWER` until lit; Calient TL1, the same with `CANC-CRS` + `DLT-CRS` per old cross-connect and `ENT-CRS` +
`ACT-CRS` per new one, then `RTRV-PORT-SUM` (OUTPWR) until lit. The raw ncclient client lowers ncclient's `TICK` to
1 ms as the driver does: its session thread sends a queued RPC only between selects of `TICK`, so with the default
0.1 s every RPC of a plain script waits about 100 ms. The overhead has no target here: it is mostly the driver's
extra round trips (error check, read-back, settling query), and a round trip costs a fraction of a millisecond over
SCPI and TL1 but several over NETCONF (ncclient, SSH, XML), so the 2 ms of the SCPI figure is no yardstick for all
four. Failover: `testbed run playbooks/gpu-failover.yaml --emulate --inventory <inv>` per protocol (the
inventories as they are, jitter 0.5 ms), failover.total of every trial, its p50 per protocol against SCPI's p50 in
the same run; target within 10 %. The job's restart, the same whatever the switch speaks, is most of a failover
and most of its noise: the bootstrap interval (trials resampled) says how far noise alone moves the ratio, and
the diagnosis row gives the segments where the protocol matters. Each round runs, per protocol, the raw client
then `testbed run` of ocs-reconfig, then the four failover runs; the order of the protocols turns by one each
round.""",
    "torch_failover": """**PyTorch failover** (`bench/torch_failover.py`, needs PyTorch: `pip install
'testbed[torch]'`). `playbooks/torch-failover-restart.yaml` run as it is (the PyTorch job, testbed-torch-train: a
two-layer perceptron trained by DistributedDataParallel over gloo on synthetic data, checkpoints every 10 steps) and
with gpu-failover's testbed-train command in its place, so the two differ in the program alone: four ranks, one per
host, under PyTorch's own torchrun (the emulated hosts hand `torchrun` to it), a random rank's GPU lost, the spare
swapped in over the OCS, every host's torchrun started again. Per round, for each job (the order turns every round): a
`testbed run --emulate` with the configured failovers (failover.total: fault injected -> the spare's first optimizer
step after the resume), then the job's restart alone (one torchrun per host started over SSH as the runner starts them,
nothing of the framework around it, the failed rank's host replaced by a spare; from the first launch command to the
spare's first step after the resume). Framework share = measured p50 - (restart alone p50 + 25 ms OCS switching + half
the 50 ms heartbeat), as for **Failover**; the survivors' teardown is in it (PyTorch's torchrun takes seconds to stop
its workers after SIGTERM, in both jobs). Most of a PyTorch relaunch is eight Pythons importing PyTorch at once (each
host's torchrun and its rank), which the machine's cores bound.""",
    "fabric_service": """**Fabric service** (`bench/fabric_service.py`). `testbed run --emulate` (cold, a subprocess) of
`playbooks/rail-reconfig.yaml` cut to on-demand and provisioning at 0 ms delay (8 ranks of the real phased job,
the rack's 25 ms OCS, jitter 0), preceded in the same run by as many plain `fabric.apply` steps of the same two
configurations. From the run's events: request -> command, from the service reading the request that completed a
change (the last rank's) to the switch's first command (`fabric_service.command_time`); light -> answer, per request
that waited, from the configuration ready (light verified) to its answer sent (`fabric_service.answer_time`).
Baseline: a fabric.apply step's path to the same switch, from its invoke recorded (just before the call leaves for
the switch's hub) to the first command: the Ray hop and the driver, which a request takes too.""",
    "rail_hiding": """**Rail train, provisioning against on-demand** (`bench/rail_hiding.py`). `testbed run --emulate`
(cold, a subprocess) of `playbooks/rail-reconfig.yaml` (8 ranks of the real phased job, 120 and 80 ms of compute, the
rack's 25 ms OCS, jitter 0) swept over static, on-demand and provisioning at 20 ms of OCS delay (a change fits in the
compute it runs behind) and 200 ms (it does not); one run a round, the order of the modes turned by one each round.
Per point, the job's own `iteration.time` and `iteration.stall` (its wait for the fabric service's answers). On-demand
pays both changes of an iteration over static; provisioning hides what it moved behind the compute: on-demand minus
provisioning, against the switching of both changes (what tests/integration/test_rail_train.py once asserted as a
wall-clock comparison; the test now holds the order of the recorded requests, changes and answers instead).""",
    "catalog_scale": """**Catalog at scale** (`bench/catalog_scale.py`). One real `testbed run
playbooks/ocs-reconfig.yaml --emulate --trials 100` (a subprocess, timed from start to exit; it indexes itself as it
ends) is copied under new run ids and start times a minute apart (`tests/catalog/catalog_copies.py`) into one results
folder, which `testbed.catalog.sync` indexes (timed: every copy read and inserted). The query, a `trend`'s work:
reconfig.total's median run by run for every run, three ways in alternating rounds (the first turns each round), which
must agree run by run: `span_columns(results, "reconfig.total")`, what trend, report --across and gate read (its sync
included: a stat per folder), and a median per run; `testbed.runs(results, spans="reconfig.total")` and a pandas
`groupby("run_id")`; and the script a user writes without the catalog: for every folder, its run.json (the start, to
order the trend) and `pd.read_csv(trials.csv)`, the span's rows, their median. pandas is imported before the rounds, as
in a notebook. The copies were just written, so both read from the page cache. Size: catalog.db and its WAL. Indexing's
share: `index_run` of one copy (what a run's end does, into the catalog of all the copies; the median of 5) over the
wall time of the 100-trial command.""",
    "netns_plane": """**--netns kernel data plane** (`bench/netns_plane.py`, root and pyroute2; skipped with the reason
otherwise). A twin of `emulated-rack.yaml` with `--netns`, ocs1 driven over SCPI, the routes of the duplex link between
gpu01:p0 and gpu02:p1 installed (`dataplane.routes`, one directed link each way; each route with its next hop's
permanent neighbour entry, so no ARP). Throughput: one TCP connection from a process in gpu01's namespace to a sink in
gpu02's at the hosts' data addresses, timed in the client from its first byte to the sink's count, against the same two
programs in two namespaces made by the benchmark and joined by one bare veth pair, alternating by round; the circuit's
path is two veth pairs and a tc u32 + mirred redirect. Circuit -> flow: gpu01 sends a UDP datagram every 0.5 ms to an
echo in gpu02's namespace while no circuit exists; the ADD of both directions goes with `*OPC?` on one line (switching
time 25 ms, no jitter); from sending it to the first echo back (the plane's own delay); the circuits removed and the
kernel seen dark between repeats. The kernel's events give seen (the twin's light tick) -> applied (netlink done).
Start-up: TwinProcess start to endpoints announced for the Opus lab cut to N hosts (8 ports each), --netns and loopback
alternating. Opus: the two opus-2048 playbooks through the CLI with `--emulate --netns`, memory as for **Opus runs**
(process tree PSS / RSS sums every 0.5 s) and the drop of /proc/meminfo MemAvailable (kernel objects included, but also
anything else running on the machine); a run that leaves namespaces is healed.""",
    "detect_zombie": detect_zombie.HOW,
    "serve": serve.HOW,
    "injob_failover": injob_failover.HOW,
}


# The benches whose rows are made by a function of their figures: name -> (that function, what the row measures
# and its target, shown when the bench failed).
ROWS_OF = {
    "detect_zombie": (detect_zombie.rows, "Detection of a SIGKILLed rank, kill -> the watch's exit", "p50 <= 100 ms"),
    "injob_failover": (
        injob_failover.rows,
        "The real PyTorch job, fault -> first step on the spare, in-job against restart",
        "in-job p50 <= 1000 ms, n >= 20",
    ),
    "catalog_scale": (_catalog_rows, "Catalog: a trend query over 1,000 runs, indexing", "< 1 s; < 5 %"),
    "serve": (
        serve.rows,
        "testbed serve: command to table vs standalone and Ansible cold; a queued run's wait; the page's first paint",
        ">= 3x Ansible cold; p50 <= 50 ms; <= 1 s",
    ),
    "rail_hiding": (
        _rail_hiding_rows,
        "Rail train: provisioning hides a small OCS delay, on-demand pays it",
        ">= 2 x the switching hidden",
    ),
    "netns_plane": (
        _netns_rows,
        "--netns kernel data plane: throughput, circuit -> flow, start-up, Opus",
        "(report)",
    ),
}


def render(results: dict, info: dict, command: str, total_s: float) -> str:
    m = info
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `{command}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"in {total_s / 60:.1f} minutes. Every figure is measured side by side with its baseline in the same "
        "run (alternating rounds); raw figures are in `bench/out/*.json` (not committed).",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}; "
        f"Python {m['python']}, Ray {m['ray']}, paramiko {m['paramiko']}, "
        f"ansible-core {m['ansible_core'] or 'absent'}, "
        f"{m['openssh'] or 'no OpenSSH client'}. Shared with other work: expect noise. The project's modules are "
        "compiled to bytecode before the first measurement, as an installed package's are"
        + (
            " (PYTHONDONTWRITEBYTECODE is set here: Python would not write them)"
            if m.get("dont_write_bytecode")
            else ""
        )
        + ".",
        "",
        "| figure | measured | baseline (same run) | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows(results):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    repeated = [
        (name, err) for name, r in results.items() if r["ok"] for err in r["figures"].get("failed_testbed_runs") or []
    ]
    if repeated:
        lines += ["", "Runs that failed and were made again (their figures are not in the table):", ""]
        lines += [f"- {name}: {' '.join(err.split())[:300]}" for name, err in repeated]
    lines += ["", "## How each figure is measured", ""]
    for name in results:
        took = results[name]["seconds"]
        lines += [
            HOW[name].replace("\n", " "),
            "",
            f"Configuration: `{results[name]['config']}`; took {took:.0f} s.",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke configuration")
    parser.add_argument("--only", nargs="+", choices=list(MODULES), help="run only these benchmarks")
    parser.add_argument("--results", type=Path, default=REPO / "bench/RESULTS.md", help="where to write the table")
    args = parser.parse_args()
    console = Console()
    command = "python bench/run_all.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    config = QUICK if args.quick else FULL
    names = args.only or list(MODULES)
    info = machine()
    compile_project()
    start = time.monotonic()
    results = run(names, config, console)
    total = time.monotonic() - start
    write_out(
        "run_all",
        {"command": command, "machine": info, "seconds": total, "results": results},
    )
    args.results.write_text(render(results, info, command, total))
    console.rule("done")
    console.print(f"{args.results} written in {total / 60:.1f} min; raw figures in {OUT}")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
