"""Health check of many emulated GPU hosts: `testbed run playbooks/gpu-health.yaml` (one actor per host,
all hosts at once) against a sequential paramiko loop doing the same work (connect with verified host keys,
nvidia-smi query, kernel-log Xid scan) host after host. Both run against the same emulated hosts.

    python bench/health_fanout.py [--hosts 64] [--rounds 3]

Reports, per round: the health step's wall time inside testbed (the coordinator's view, Ray included),
testbed's whole run (Ray start, 64 actors, twin), and the sequential loop.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from rich.console import Console  # noqa: E402

from drivers.gpuhost import GpuHostSsh  # noqa: E402
from drivers.ssh import SshSettings, SshTransport  # noqa: E402
from emulators.twin import TwinProcess  # noqa: E402
from testbed.config import load_inventory, load_playbook  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.runner.ray_session import ray_session  # noqa: E402
from testbed.runner.run import RunOptions, run_plan  # noqa: E402
from testbed.twin import twin_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def inventory_text(hosts: int) -> str:
    lines = ["name: bench-hosts", "emulated_only: true", "devices:"]
    for i in range(1, hosts + 1):
        lines.append(
            f"  h{i:03d}: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: h{i:03d}.lab.example, "
            "user: lab}, gpus: 8}"
        )
    return "\n".join(lines) + "\n"


def sequential(inventory: Path) -> float:
    inv = load_inventory(inventory).model
    with TwinProcess(twin_spec(inv, 0)) as twin:
        start = time.perf_counter()
        for name, ep in twin.endpoints.devices.items():
            host, _, port = ep["ssh"].rpartition(":")
            settings = SshSettings(
                host=host, port=int(port), user=ep["user"], key_file=ep["key_file"], known_hosts=ep["known_hosts"]
            )
            driver = GpuHostSsh(SshTransport(settings, name, None), name)
            assert driver.health()["ok"]
            driver.close()
        return time.perf_counter() - start


def with_testbed(inventory: Path, results: Path) -> tuple[float, float]:
    inv = load_inventory(inventory).model
    plan = make_plan(load_playbook(REPO / "playbooks/gpu-health.yaml", inv).model, inv)
    start = time.perf_counter()
    with ray_session(None):
        outcome = run_plan(
            plan,
            RunOptions("gpu-health.yaml", str(inventory), results, emulate=True),
            Console(file=open(os.devnull, "w")),
        )  # noqa: SIM115
    whole = time.perf_counter() - start
    assert outcome.status == "ok", outcome.error
    return outcome.summary["spans"]["health.wall"]["max_ms"] / 1000, whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    step, whole, seq = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "hosts.yaml"
        inventory.write_text(inventory_text(args.hosts))
        for r in range(args.rounds):
            s, w = with_testbed(inventory, Path(tmp) / "results")
            step.append(s)
            whole.append(w)
            seq.append(sequential(inventory))
            console.print(
                f"round {r + 1}: testbed health step {s:.2f} s (whole run {w:.1f} s), "
                f"sequential paramiko {seq[-1]:.2f} s"
            )
    result = {
        "hosts": args.hosts,
        "testbed_step_s_median": float(np.median(step)),
        "testbed_run_s_median": float(np.median(whole)),
        "sequential_s_median": float(np.median(seq)),
    }
    result["speedup_step_vs_sequential"] = result["sequential_s_median"] / result["testbed_step_s_median"]
    console.print(
        f"{args.hosts} hosts: testbed health step {result['testbed_step_s_median']:.2f} s median "
        f"(target <= 3 s), whole run {result['testbed_run_s_median']:.1f} s; sequential paramiko "
        f"{result['sequential_s_median']:.2f} s; speed-up {result['speedup_step_vs_sequential']:.1f}x"
    )
    out = REPO / "bench/out"
    out.mkdir(exist_ok=True)
    (out / "health_fanout.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
