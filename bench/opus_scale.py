"""Opus scale: 2048 GPUs as 256 emulated hosts x 8 GPUs, one rail per GPU index, each rail a 256-port OCS.

    python bench/opus_scale.py [--trials 10] [--rounds 3] [--hosts 256]

(a) Rail reconfiguration: every switch moves all 256 of its circuits (a full permutation: ingress i goes
    from egress 256+(i+1 mod 256)+1 to 256+(i+2 mod 256)+1 and back) through `testbed run` (one Ray actor
    per switch, the change sent to all of them at once), against the same change on one switch alone.
    Each reconfiguration is measured from the first command sent to the last switch's egress ports all
    lit (the runner's reconfig span). Figure: ratio of the medians, 8 switches / 1 switch. The switches
    are modelled with 25 ms switching time and no jitter, so the ratio is the framework's (and the
    emulator's) cost of driving eight switches at once, not the max of eight random delays.
    Alternating rounds, one `testbed run` of each per round.
(b) Memory per emulated device: the twin process's RSS (/proc/PID/status VmRSS, with everything started)
    with the full population (256 hosts, 8 switches, 2048 fibres) minus an empty twin's, divided by the
    number of devices; also a host's marginal cost (a twin of 256 hosts minus one of 128, per host), which
    leaves out what any twin with hosts loads once (paramiko). And the controller: the peak RSS and PSS of
    each `ray::DeviceHub` worker process during the 8-switch run (a switch has a hub process of its own), and
    their PSS per switch.

The inventory is playbooks/inventory/opus-2048.yaml (256 hosts with ports r0..r7, rail k's fibres on switch
railk: host n's rk transmits into ingress n, egress 256+n back to it), 45 lines of host ranges, a group and a
fibre pattern. Another --hosts builds the same lab with fewer hosts in code (inventory_data) and writes it as
YAML, so a run's folder refers to a file either way; tests/config/test_inventory_shorthands.py checks that
the shipped file and inventory_data(256) give the same devices and fibres.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import ActorMemory, compile_project, memory_kib, quiet_console, stats, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

from emulators.spec import TwinSpec  # noqa: E402
from emulators.twin import TwinProcess  # noqa: E402
from testbed.documents import load_inventory, load_playbook  # noqa: E402
from testbed.engine.ray_session import ray_session  # noqa: E402
from testbed.engine.run import RunOptions  # noqa: E402
from testbed.lab import run_plan  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.twin.bridge import twin_spec  # noqa: E402

RAILS = 8
PORTS = 256
SWITCHING_MS = 25.0
OPUS_INVENTORY = Path(__file__).resolve().parent.parent / "playbooks" / "inventory" / "opus-2048.yaml"


def inventory_file(directory: Path, hosts: int) -> Path:
    """The shipped opus-2048.yaml for the full lab; for a smaller one, inventory_data written into `directory`
    (a YAML variant of the file would be a second copy of the lab to keep in step; the code is one).
    """
    if hosts == PORTS:  # every switch port cabled: the lab the file describes
        return OPUS_INVENTORY
    return write_yaml(directory / "opus-inventory.yaml", inventory_data(hosts))


def inventory_data(hosts: int = 256, rails: int = RAILS, ports: int = PORTS) -> dict:
    """The Opus lab with `hosts` hosts, as plain data (what opus-2048.yaml expands to, for hosts=256)."""
    devices: dict = {}
    for k in range(rails):
        devices[f"rail{k}"] = {
            "kind": "ocs",
            "driver": "polatis-scpi",
            # a documentation-range address: the inventory is for --emulate only
            "transport": {"type": "visa", "resource": f"TCPIP0::192.0.2.{100 + k}::5025::SOCKET", "timeout_ms": 10000},
            "size": ports,
            "emulation": {
                "switching_time_ms": SWITCHING_MS,
                "jitter_ms": 0,
                "idn": f"Polatis,N-OST-{ports}x{ports},{k:06d},6.5.2.18",
            },
        }
    fibres = []
    for n in range(1, hosts + 1):
        name = f"h{n:03d}"
        devices[name] = {
            "kind": "gpu_host",
            "driver": "ssh",
            "transport": {"type": "ssh", "host": f"{name}.lab.example", "user": "lab"},
            "gpus": 8,
            "ports": [f"r{k}" for k in range(rails)],
            "rack": f"rack{(n - 1) // 32 + 1}",
        }
        for k in range(rails):
            fibres.append({"host": name, "port": f"r{k}", "switch": f"rail{k}", "ingress": n, "egress": ports + n})
    return {
        "name": f"opus-{hosts * 8}",
        "description": f"{hosts * 8} GPUs: {hosts} hosts x 8 GPUs, {rails} rails of {ports}-port OCSes",
        "emulated_only": True,
        "devices": devices,
        "fibres": fibres,
    }


def permutation(shift: int, ports: int = PORTS) -> list[list[int]]:
    """Every ingress i to egress ports + ((i - 1 + shift) mod ports) + 1: a full permutation."""
    return [[i, ports + (i - 1 + shift) % ports + 1] for i in range(1, ports + 1)]


def playbook_data(switches: list[str], trials: int) -> dict:
    def config(shift: int) -> dict:
        return {
            "description": f"every ingress to the egress {shift} further on, on every rail",
            "circuits": {sw: permutation(shift) for sw in switches},
        }

    return {
        "name": "opus-rail",
        "description": f"full-permutation rail reconfiguration on {len(switches)} switch(es) at once",
        "trials": trials,
        "seed": 0,
        "configurations": {"shift1": config(1), "shift2": config(2)},
        # start from a full permutation, so every measured change moves all circuits of every switch
        "setup": [{"action": "fabric.apply", "configuration": "shift2"}],
        "steps": [
            {"action": "fabric.apply", "configuration": "shift1", "measure": "rail"},
            {"action": "fabric.apply", "configuration": "shift2", "measure": "rail"},
        ],
        "teardown": [{"action": "fabric.clear"}],
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=200))
    return path


def rail_run(inventory: Path, playbook: Path, results: Path, memory: ActorMemory | None = None) -> list[float]:
    """One `testbed run` of the rail playbook; the reconfig total of every measured change, in ms."""
    inv = load_inventory(inventory).model
    plan = make_plan(load_playbook(playbook, inv).model, inv)
    with ray_session(None):
        if memory is not None:
            with memory:
                outcome = run_plan(
                    plan, RunOptions(str(playbook), str(inventory), results, emulate=True), quiet_console()
                )
        else:
            outcome = run_plan(plan, RunOptions(str(playbook), str(inventory), results, emulate=True), quiet_console())
    if outcome.status != "ok":
        raise RuntimeError(f"opus rail run {outcome.run_dir} failed: {outcome.error}")
    out = []
    for line in (outcome.run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "measure" and e["op"] == "rail.total":
            out.append(e["data"]["ms"])
    return out


def _chanlist(ports) -> str:
    return "(@" + ",".join(str(p) for p in ports) + ")"


def raw_rail(inventory: Path, switches: list[str], changes: int) -> list[float]:
    """Diagnosis, no framework: the same full-permutation changes driven by a minimal raw-socket script on
    each switch (one thread per switch, released together): SUB, ADD, `*OPC?`, then `PMON:POW?` until every
    egress is lit. Per change, ms from the release to the last switch lit. Tells how much of the ratio
    is the twin (one process serving every switch) and the 2 cores rather than the framework.
    """
    inv = load_inventory(inventory).model
    with TwinProcess(twin_spec(inv, 0, only=set(switches)), start_timeout=120) as twin:
        conns = {}
        for sw in switches:
            host, port = twin.endpoints.devices[sw]["tcp"].rsplit(":", 1)
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns[sw] = (sock, sock.makefile("rb"))

        def query(sw: str, cmd: str) -> str:
            sock, reader = conns[sw]
            sock.sendall(cmd.encode() + b"\n")
            return reader.readline().decode().strip()

        def change(sw: str, old: list, new: list, go: threading.Barrier) -> float:
            go.wait()
            sock, _ = conns[sw]
            if old:
                sock.sendall(
                    f":OXC:SWIT:CONN:SUB {_chanlist(i for i, _ in old)},{_chanlist(e for _, e in old)}\n".encode()
                )
            sock.sendall(f":OXC:SWIT:CONN:ADD {_chanlist(i for i, _ in new)},{_chanlist(e for _, e in new)}\n".encode())
            if query(sw, "*OPC?") != "1":
                raise RuntimeError(f"{sw}: *OPC? did not answer 1")
            egress = _chanlist(e for _, e in new)
            while min(float(x) for x in query(sw, f":PMON:POW? {egress}").split(",")) < -20:
                time.sleep(0.001)
            return time.perf_counter()

        out = []
        current: list = []
        with ThreadPoolExecutor(max_workers=len(switches)) as pool:
            for i in range(changes + 1):
                target = permutation(1 + i % 2)
                go = threading.Barrier(len(switches) + 1)
                futures = [pool.submit(change, sw, current, target, go) for sw in switches]
                go.wait()
                start = time.perf_counter()
                done = max(f.result() for f in futures)
                if i > 0:  # the first change starts from an empty switch: not a full permutation move
                    out.append((done - start) * 1000)
                current = target
        for sock, reader in conns.values():
            reader.close()
            sock.close()
    return out


def twin_rss(spec: TwinSpec) -> dict:
    """The twin process's memory once it has announced its endpoints (everything started), and how long
    it took to start.
    """
    start = time.perf_counter()
    with TwinProcess(spec, start_timeout=300) as twin:
        started = time.perf_counter() - start
        mem = memory_kib(twin.process.pid)
        threads = len(list(Path(f"/proc/{twin.process.pid}/task").iterdir()))
    return {**mem, "start_s": started, "threads": threads, "devices": len(spec.devices)}


def twin_memory(inventory: Path, hosts: int) -> dict:
    inv = load_inventory(inventory).model
    full_spec = twin_spec(inv, 0)
    half = {f"h{n:03d}" for n in range(1, hosts // 2 + 1)}
    all_hosts = {n for n, d in inv.devices.items() if d.kind == "gpu_host"}
    empty = twin_rss(TwinSpec(devices=[], fibres=[]))
    full = twin_rss(full_spec)
    hosts_half = twin_rss(twin_spec(inv, 0, only=half))
    hosts_all = twin_rss(twin_spec(inv, 0, only=all_hosts))
    devices = full["devices"]
    return {
        "empty": empty,
        "full": full,
        "hosts_half": hosts_half,
        "hosts_all": hosts_all,
        "per_device_kib": (full["rss_kib"] - empty["rss_kib"]) / devices,
        "per_host_marginal_kib": (hosts_all["rss_kib"] - hosts_half["rss_kib"]) / (len(all_hosts) - len(half)),
    }


def measure(trials: int = 10, rounds: int = 3, hosts: int = 256, console: Console | None = None) -> dict:
    console = console or Console()
    switches = [f"rail{k}" for k in range(RAILS)]
    all_ms: list[float] = []
    one_ms: list[float] = []
    raw_all: list[float] = []
    raw_one: list[float] = []
    memory = ActorMemory()
    failed_runs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-opus-") as tmp:
        tmp_path = Path(tmp)
        inventory = inventory_file(tmp_path, hosts)
        pb_all = write_yaml(tmp_path / "opus-rail-8.yaml", playbook_data(switches, trials))
        pb_one = write_yaml(tmp_path / "opus-rail-1.yaml", playbook_data(switches[:1], trials))
        for r in range(rounds):
            # the order alternates, so neither always runs on a machine the other has just warmed
            order = [("all", pb_all), ("one", pb_one)] if r % 2 == 0 else [("one", pb_one), ("all", pb_all)]
            for which, pb in order:
                sampler = memory if (which == "all" and r == 0) else None
                try:
                    values = rail_run(inventory, pb, tmp_path / "results", sampler)
                except RuntimeError as exc:  # reported with the figures, and the run is made again once
                    failed_runs.append(str(exc))
                    console.print(f"[yellow]round {r + 1}: {exc}; running it again[/]")
                    values = rail_run(inventory, pb, tmp_path / "results", None)
                (all_ms if which == "all" else one_ms).extend(values)
            raw_all += raw_rail(inventory, switches, 2 * trials)
            raw_one += raw_rail(inventory, switches[:1], 2 * trials)
            console.print(
                f"round {r + 1}/{rounds}: {RAILS} switches p50 {np.median(all_ms):.1f} ms, "
                f"1 switch p50 {np.median(one_ms):.1f} ms"
            )
        twin = twin_memory(inventory, hosts)
    actors = memory.summary(devices=RAILS)  # sampled in the run on all 8 switches
    result = {
        "hosts": hosts,
        "gpus": hosts * 8,
        "rails": RAILS,
        "ports": PORTS,
        "circuits_per_switch": PORTS,
        "switching_time_ms": SWITCHING_MS,
        "rounds": rounds,
        "trials_per_run": trials,
        "all_switches_ms": stats(all_ms),
        "one_switch_ms": stats(one_ms),
        "raw_all_switches_ms": stats(raw_all),
        "raw_one_switch_ms": stats(raw_one),
        "twin_memory": twin,
        "device_actor_memory": actors,
        "failed_testbed_runs": failed_runs,
    }
    result["ratio_p50"] = result["all_switches_ms"]["p50"] / result["one_switch_ms"]["p50"]
    result["raw_ratio_p50"] = result["raw_all_switches_ms"]["p50"] / result["raw_one_switch_ms"]["p50"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per run (two changes each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=256)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.trials, args.rounds, args.hosts, console)
    twin = result["twin_memory"]
    console.print(
        f"rail reconfiguration: {RAILS} switches {result['all_switches_ms']['p50']:.1f} ms, one switch "
        f"{result['one_switch_ms']['p50']:.1f} ms, ratio {result['ratio_p50']:.2f} (target <= 1.5); raw script: "
        f"{result['raw_all_switches_ms']['p50']:.1f} ms against {result['raw_one_switch_ms']['p50']:.1f} ms, "
        f"ratio {result['raw_ratio_p50']:.2f}"
    )
    console.print(
        f"twin memory: {twin['per_device_kib']:.0f} KiB per device ({twin['full']['devices']} devices, "
        f"RSS {twin['full']['rss_kib'] / 1024:.0f} MiB against {twin['empty']['rss_kib'] / 1024:.0f} MiB empty); "
        f"a host's marginal cost {twin['per_host_marginal_kib']:.0f} KiB"
    )
    actors = result["device_actor_memory"]
    if actors.get("rss_mib_p50"):
        console.print(
            f"device hubs: {actors['rss_mib_p50']:.0f} MiB RSS, {actors['pss_mib_p50']:.0f} MiB PSS each "
            f"({actors['actors_seen']} seen, serving {RAILS} switches, a process each: "
            f"{actors['pss_mib_per_device']:.1f} MiB PSS per switch)"
        )
    write_out("opus_scale", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
