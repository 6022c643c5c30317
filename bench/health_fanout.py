"""Health check of many emulated GPU hosts: `testbed run playbooks/gpu-health.yaml` (one hub actor serving
every host, a thread each, all hosts at once) against Ansible's ad-hoc `raw` module (OpenSSH underneath,
default forks and one fork per host) and against a sequential paramiko loop, all over the same kind of
emulated hosts, in alternating rounds.

    python bench/health_fanout.py [--hosts 64] [--rounds 3] [--checks 5]

Every contender runs the checks `GpuHostSsh.health()` runs: `nvidia-smi --query-gpu=... --format=csv,
noheader,nounits` and `dmesg`, with host keys verified against the twin's known_hosts (Ansible: through
OpenSSH's UserKnownHostsFile and StrictHostKeyChecking=yes; never disabled).

Figures per round:
- testbed: the health step's wall time (the coordinator's view, Ray included; the actors are connected,
  as in any step after the first) over --checks trials. Command to table, from typing `testbed run` (a fresh
  process) to the end of the first health step (imports, Ray, the hub, SSH connections, the check):
  "emulated": `--emulate`, the command starts its own twin and its own Ray, as on a laptop; "on the lab": the
  hosts are up already, as Ansible's are (the same running twin, reached through a lab inventory of its
  addresses, no --emulate: leases, locks and host keys as on a real lab), the command starting its own local
  Ray; "on the lab, its cluster up": the same with `--ray-address` of a Ray cluster already up (how a lab runs
  testbed across control hosts: the cluster is part of the lab, started once, not per command; here a one-node
  cluster on this machine, started before the rounds and not counted); "warm session": in a testbed.Lab that
  has run once, from calling `lab.run` to the end of the first health step;
- ansible, per forks setting: "cold" (a fresh ControlPath directory, so OpenSSH connects and
  authenticates every host) and "warm" (right after, reusing the ControlPersist masters: connected, as
  the testbed actors are);
- sequential paramiko: connect, check, close, host after host;
- diagnosis: parallel paramiko, connected: a thread per host in one process, connections open, no Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import ActorMemory, compile_project, quiet_console, write_out  # noqa: E402
from rich.console import Console  # noqa: E402

from drivers.gpuhost import GPU_QUERY, GpuHostSsh  # noqa: E402
from drivers.transports.ssh import SshSettings, SshTransport  # noqa: E402
from emulators.twin import TwinProcess  # noqa: E402
from testbed.documents import load_inventory  # noqa: E402
from testbed.twin.bridge import twin_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The two commands GpuHostSsh.health() runs (drivers/gpuhost/probes.py: gpus() and kernel_xids()), as one line.
HEALTH_COMMAND = f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits ; dmesg"


def inventory_text(hosts: int) -> str:
    lines = ["name: bench-hosts", "emulated_only: true", "devices:"]
    for i in range(1, hosts + 1):
        lines.append(
            f"  h{i:03d}: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: h{i:03d}.lab.example, "
            "user: lab}, gpus: 8}"
        )
    return "\n".join(lines) + "\n"


def lab_inventory(endpoints: dict, path: Path) -> Path:
    """The inventory a lab would write for the twin's hosts, which are up already: each host's address,
    port, user, key and known_hosts (no emulated_only: runs on it are lab runs).
    """
    lines = ["name: bench-lab", "devices:"]
    for name, ep in endpoints.items():
        host, _, port = ep["ssh"].rpartition(":")
        transport = (
            f'{{type: ssh, host: {host}, port: {port}, user: {ep["user"]}, key_file: "{ep["key_file"]}", '
            f'known_hosts: "{ep["known_hosts"]}"}}'
        )
        lines.append(f"  {name}: {{kind: gpu_host, driver: ssh, transport: {transport}, gpus: 8}}")
    path.write_text("\n".join(lines) + "\n")
    return path


# --- sequential paramiko ----------------------------------------------------------------------------


def sequential(endpoints: dict) -> float:
    """Seconds to connect to, health-check and disconnect from every host, one after the other."""
    start = time.perf_counter()
    for name, ep in endpoints.items():
        host, _, port = ep["ssh"].rpartition(":")
        settings = SshSettings(
            host=host, port=int(port), user=ep["user"], key_file=ep["key_file"], known_hosts=ep["known_hosts"]
        )
        driver = GpuHostSsh(SshTransport(settings, name, None), name)
        assert driver.health()["ok"], name
        driver.close()
    return time.perf_counter() - start


def parallel_connected(endpoints: dict, checks: int) -> list[float]:
    """Diagnosis, no framework: one paramiko connection per host opened beforehand, then `checks` times
    the same health check on every host at once (a thread each); seconds per check. Tells how much of
    the testbed step is SSH and the emulated hosts on this machine rather than Ray and the runner.
    """
    drivers = []
    for name, ep in endpoints.items():
        host, _, port = ep["ssh"].rpartition(":")
        settings = SshSettings(
            host=host, port=int(port), user=ep["user"], key_file=ep["key_file"], known_hosts=ep["known_hosts"]
        )
        drivers.append(GpuHostSsh(SshTransport(settings, name, None), name))
    try:
        with ThreadPoolExecutor(max_workers=len(drivers)) as pool:
            list(pool.map(lambda d: d.identify(), drivers))  # connect, as the actors do at start
            out = []
            for _ in range(checks):
                start = time.perf_counter()
                if not all(h["ok"] for h in pool.map(lambda d: d.health(), drivers)):
                    raise RuntimeError("a host reported unhealthy in the parallel paramiko check")
                out.append(time.perf_counter() - start)
            return out
    finally:
        for d in drivers:
            d.close()


# --- Ansible ----------------------------------------------------------------------------------------


def ansible_binary() -> str | None:
    """The `ansible` of this Python environment (pip install -e '.[bench]'), else one on the PATH."""
    beside = Path(sys.executable).parent / "ansible"
    return str(beside) if beside.exists() else shutil.which("ansible")


def ansible_inventory(endpoints: dict, path: Path) -> Path:
    """An INI inventory of the twin's hosts: address, port, user, key, and the twin's known_hosts with
    strict host key checking (the same verification the framework's paramiko RejectPolicy does).
    """
    lines = ["[gpu_hosts]"]
    for name, ep in endpoints.items():
        host, _, port = ep["ssh"].rpartition(":")
        ssh_args = f"-o UserKnownHostsFile={ep['known_hosts']} -o StrictHostKeyChecking=yes"
        lines.append(
            f"{name} ansible_host={host} ansible_port={port} ansible_user={ep['user']} "
            f"ansible_ssh_private_key_file={ep['key_file']} ansible_ssh_common_args={shlex.quote(ssh_args)}"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def ansible_env(control_dir: Path, home: Path) -> dict:
    env = dict(os.environ)
    env.update(
        ANSIBLE_HOME=str(home),  # nothing of a user's ~/.ansible is read or written
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_SSH_CONTROL_PATH_DIR=str(control_dir),
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_NOCOLOR="1",
    )
    env.pop("ANSIBLE_CONFIG", None)
    return env


def ansible_once(binary: str, inventory: Path, forks: int, env: dict, hosts: int, cwd: Path) -> float:
    """Seconds for one `ansible all -m raw` of the health commands over every host; raises unless every
    host answered with exit status 0 and no Xid line.
    """
    command = [binary, "all", "-i", str(inventory), "-m", "raw", "-a", HEALTH_COMMAND, "-f", str(forks), "-o"]
    start = time.perf_counter()
    r = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    seconds = time.perf_counter() - start
    ok = sum(1 for line in r.stdout.splitlines() if "| CHANGED | rc=0 |" in line)
    if r.returncode != 0 or ok != hosts or "NVRM: Xid" in r.stdout:
        raise RuntimeError(
            f"ansible -f {forks}: exit status {r.returncode}, {ok} of {hosts} hosts answered rc=0\n"
            f"command: {shlex.join(command)}\nstdout (end): {r.stdout[-1500:]}\nstderr (end): {r.stderr[-1500:]}"
        )
    return seconds


# --- testbed ----------------------------------------------------------------------------------------


def with_testbed(
    inventory: Path,
    results: Path,
    checks: int,
    sample_memory: bool = False,
    ray_address: str | None = None,
    emulate: bool = True,
) -> dict:
    """One `testbed run` of gpu-health.yaml with `checks` trials, in a fresh process as a user starts it:
    every health step's wall time, the cold time from the command to the end of the first one, and
    (sample_memory) the memory of the hub serving the hosts. With ray_address, the run joins that cluster;
    without emulate, `inventory` is a lab's (lab_inventory: hosts that are up already) and the run is a lab
    run (its leases in a folder of `results`'s parent, not the machine's).
    """
    command = [sys.executable, "-m", "testbed", "run", str(REPO / "playbooks/gpu-health.yaml")]
    command += ["--emulate"] if emulate else []
    command += ["--inventory", str(inventory), "--trials", str(checks), "--results", str(results)]
    if ray_address is not None:
        command += ["--ray-address", ray_address]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["TESTBED_LEASE_DIR"] = str(results.parent / "leases")
    memory = ActorMemory()
    start = time.monotonic_ns()  # CLOCK_MONOTONIC, as the run's events: one clock for the machine
    with memory if sample_memory else contextlib.nullcontext():
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    whole = (time.monotonic_ns() - start) / 1e9
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not last.startswith("results: "):
        raise RunFailed(f"testbed run exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    run_dir = Path(last.removeprefix("results: "))
    walls = _health_walls(run_dir / "events.jsonl")
    startup = json.loads((run_dir / "run.json").read_text())["startup_s"]
    cold = (walls[0][1] - start) / 1e9
    return {
        "steps_s": [ms / 1000 for ms, _ in walls],
        "cold_s": cold,
        "whole_s": whole,
        "startup_s": startup,
        "actor_memory": memory.summary(devices=len(load_inventory(inventory).model.devices)),
    }


@contextlib.contextmanager
def lab_cluster():
    """A Ray cluster up before the command, as a lab's is (one node, on this machine): its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"include_dashboard": False})
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


# The floor of any command that starts its own local Ray: a fresh Python that starts Ray as `testbed run` does and
# places one device hub (its process and its modules, no device), which `testbed run` must have before its first
# device command. What is left of Ansible's cold time after it is the budget for every SSH connection and the check.
RAY_AND_HUB = (
    "from testbed.engine.ray_session import ray_session\n"
    "with ray_session(None) as ray:\n"
    "    from testbed.engine.hub import DeviceHub\n"
    "    hub = ray.remote(DeviceHub).options(num_cpus=0).remote([])\n"
    "    ray.get(hub.open_direct.remote(b'floor'), timeout=120)\n"
    "    print('up', flush=True)\n"
)


def ray_and_hub() -> float:
    """Seconds from starting a fresh Python to its first hub up on a local Ray it started (RAY_AND_HUB)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", RAY_AND_HUB], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    up = time.monotonic() - start
    proc.wait(timeout=120)
    if line.strip() != "up" or proc.returncode != 0:
        raise RunFailed(f"a local Ray with one hub did not come up (exit status {proc.returncode})")
    return up


def warm_session(inventory: Path, results: Path) -> float:
    """In a warm testbed.Lab (one run done): seconds from calling lab.run(gpu-health) to the end of its
    first health step.
    """
    import testbed

    with testbed.Lab(inventory, emulate=True, results=results, console=quiet_console()) as lab:
        lab.run(REPO / "playbooks/gpu-health.yaml", trials=1)
        called = time.monotonic_ns()
        run = lab.run(REPO / "playbooks/gpu-health.yaml", trials=1)
        if not run.ok:
            raise RunFailed(f"lab.run {run.folder.name}: {run.error}")
        return (_health_walls(run.folder / "events.jsonl")[0][1] - called) / 1e9


class RunFailed(RuntimeError):
    pass


def _health_walls(events: Path) -> list[tuple[float, int]]:
    out = []
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "measure" and e["op"] == "health.wall":
            out.append((e["data"]["ms"], e["data"]["end_ns"]))
    return out


# --- the benchmark ----------------------------------------------------------------------------------


def measure(
    hosts: int = 64, rounds: int = 3, checks: int = 5, forks: tuple[int, ...] = (5, 64), console: Console | None = None
) -> dict:
    console = console or Console()
    binary = ansible_binary()
    steps: list[float] = []
    cold: list[float] = []
    cold_lab: list[float] = []  # the hosts up already (the twin, as Ansible gets it), a local Ray started
    cold_cluster: list[float] = []  # the same, the lab's Ray cluster up
    floor: list[float] = []  # a fresh Python to a local Ray with one hub up, nothing else (RAY_AND_HUB)
    warm_lab: list[float] = []
    whole: list[float] = []
    seq: list[float] = []
    parallel: list[float] = []
    ans: dict[str, list[float]] = {f"f{f}_{k}": [] for f in forks for k in ("cold", "warm")}
    memory = []
    failed_runs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp, lab_cluster() as cluster:
        tmp_path = Path(tmp)
        inventory = tmp_path / "hosts.yaml"
        inventory.write_text(inventory_text(hosts))
        for r in range(rounds):
            # the actors' memory is sampled in the first round only (a /proc scan a second, in this process)
            try:
                tb = with_testbed(inventory, tmp_path / "results", checks, sample_memory=r == 0)
            except RunFailed as exc:  # reported with the figures, and the round is run again once
                failed_runs.append(str(exc))
                console.print(f"[yellow]round {r + 1}: {exc}; running it again[/]")
                tb = with_testbed(inventory, tmp_path / "results", checks, sample_memory=r == 0)
            steps += tb["steps_s"]
            cold.append(tb["cold_s"])
            whole.append(tb["whole_s"])
            warm_lab.append(warm_session(inventory, tmp_path / "results"))
            if r == 0:
                memory.append(tb["actor_memory"])
            inv = load_inventory(inventory).model
            with TwinProcess(twin_spec(inv, 0), start_timeout=120) as twin:
                endpoints = twin.endpoints.devices
                lab = lab_inventory(endpoints, tmp_path / f"lab-{r}.yaml")
                on_lab = [(cold_lab, None), (cold_cluster, cluster)]  # which goes first alternates by round
                for samples, address in on_lab if r % 2 == 0 else reversed(on_lab):
                    run = with_testbed(lab, tmp_path / "results", 1, ray_address=address, emulate=False)
                    samples.append(run["cold_s"])
                floor.append(ray_and_hub())
                seq.append(sequential(endpoints))
                parallel += parallel_connected(endpoints, checks)
                if binary is not None:
                    ini = ansible_inventory(endpoints, tmp_path / f"ansible-{r}.ini")
                    order = forks if r % 2 == 0 else tuple(reversed(forks))  # neither always goes first
                    for f in order:
                        env = ansible_env(tmp_path / f"cp-{r}-{f}", tmp_path / "ansible-home")
                        ans[f"f{f}_cold"].append(ansible_once(binary, ini, f, env, hosts, tmp_path))
                        ans[f"f{f}_warm"].append(ansible_once(binary, ini, f, env, hosts, tmp_path))
            line = (
                f"round {r + 1}/{rounds}: testbed health step p50 {np.median(tb['steps_s']):.3f} s "
                f"(cold {tb['cold_s']:.1f} s), sequential paramiko {seq[-1]:.2f} s"
            )
            for f in forks:
                if ans[f"f{f}_cold"]:
                    line += f", ansible -f {f} cold {ans[f'f{f}_cold'][-1]:.2f} s warm {ans[f'f{f}_warm'][-1]:.2f} s"
            console.print(line)
    result: dict = {
        "hosts": hosts,
        "rounds": rounds,
        "checks_per_round": checks,
        "health_command": HEALTH_COMMAND,
        "testbed_step_s": _s(steps),
        "testbed_cold_s": _s(cold),
        "testbed_cold_on_lab_s": _s(cold_lab),
        "testbed_cold_on_lab_cluster_s": _s(cold_cluster),
        "local_ray_and_hub_s": _s(floor),
        "testbed_warm_session_s": _s(warm_lab),
        "testbed_run_s": _s(whole),
        "sequential_s": _s(seq),
        "parallel_paramiko_connected_s": _s(parallel),
        "host_actor_memory": memory[0] if memory else None,
        "failed_testbed_runs": failed_runs,
        "ansible": None if binary is None else {k: _s(v) for k, v in ans.items()},
        "ansible_missing": None if binary else "ansible not installed: pip install -e '.[bench]'",
    }
    result["speedup_step_vs_sequential"] = result["sequential_s"]["p50"] / result["testbed_step_s"]["p50"]
    if binary is not None:
        warm = {f: result["ansible"][f"f{f}_warm"]["p50"] for f in forks}
        cold_a = {f: result["ansible"][f"f{f}_cold"]["p50"] for f in forks}
        best_warm = min(warm, key=warm.get)
        best_cold = min(cold_a, key=cold_a.get)
        result["ansible_best_warm"] = {"forks": best_warm, "p50_s": warm[best_warm]}
        result["ansible_best_cold"] = {"forks": best_cold, "p50_s": cold_a[best_cold]}
        result["speedup_step_vs_ansible_warm"] = warm[best_warm] / result["testbed_step_s"]["p50"]
        result["speedup_cold_vs_ansible_cold"] = cold_a[best_cold] / result["testbed_cold_s"]["p50"]
        result["speedup_cold_on_lab_vs_ansible_cold"] = cold_a[best_cold] / result["testbed_cold_on_lab_s"]["p50"]
        result["speedup_cold_on_lab_cluster_vs_ansible_cold"] = (
            cold_a[best_cold] / result["testbed_cold_on_lab_cluster_s"]["p50"]
        )
        result["speedup_warm_session_vs_ansible_cold"] = cold_a[best_cold] / result["testbed_warm_session_s"]["p50"]
    return result


def _s(samples: list[float]) -> dict:
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return {"n": 0}
    return {"n": int(x.size), "p50": float(np.median(x)), "p99": float(np.percentile(x, 99)), "max": float(x.max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checks", type=int, default=5, help="health steps per testbed run")
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.hosts, args.rounds, args.checks, console=console)
    console.print(
        f"{args.hosts} hosts: testbed health step {result['testbed_step_s']['p50']:.3f} s median "
        f"(cold {result['testbed_cold_s']['p50']:.1f} s); sequential paramiko {result['sequential_s']['p50']:.2f} s "
        f"({result['speedup_step_vs_sequential']:.1f}x)"
    )
    if result["ansible"] is not None:
        best = result["ansible_best_warm"]
        console.print(
            f"best ansible warm: -f {best['forks']} {best['p50_s']:.2f} s; testbed is "
            f"{result['speedup_step_vs_ansible_warm']:.1f}x faster (target >= 10x); cold: testbed "
            f"{result['testbed_cold_s']['p50']:.1f} s against ansible {result['ansible_best_cold']['p50_s']:.2f} s"
        )
    else:
        console.print(f"[yellow]{result['ansible_missing']}[/]")
    write_out("health_fanout", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
