"""Framework overhead per OCS reconfiguration: `testbed run` against a minimal raw-socket script.

Both drive the same emulated switch (switching time 25 ms, no jitter) through the same cycle of
configurations from playbooks/ocs-reconfig.yaml. For each, the cycle time is the interval between the
first command of one reconfiguration and the first command of the next, so it contains everything a
reconfiguration costs: the switch's own settling, the wire, and (for testbed) Ray, the driver's error
checks and read-back, and the event recording. overhead = cycle(testbed) - cycle(raw), as p50 and p99.
The two are run in alternating rounds so that machine noise hits both alike.

    python bench/ocs_overhead.py [--reconfigs 300] [--rounds 3]

`measure()` returns the figures (bench/run_all.py calls it); main() prints them and writes
bench/out/ocs_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from benchlib import compile_project, write_out  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from emulators.twin import TwinProcess  # noqa: E402
from testbed.documents import load_inventory, load_playbook  # noqa: E402
from testbed.engine.ray_session import ray_session  # noqa: E402
from testbed.engine.run import RunOptions  # noqa: E402
from testbed.lab import run_plan  # noqa: E402
from testbed.plan import make_plan  # noqa: E402
from testbed.steps import ApplyStep  # noqa: E402
from testbed.twin.bridge import twin_spec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks/ocs-reconfig.yaml"
INVENTORY = REPO / "playbooks/inventory/emulated-rack.yaml"


def no_jitter_inventory(tmp: Path) -> Path:
    text = INVENTORY.read_text().replace("jitter_ms: 0.5", "jitter_ms: 0")
    path = tmp / "bench-rack.yaml"
    path.write_text(text)
    return path


def chanlist(ports) -> str:
    return "(@" + ",".join(str(p) for p in ports) + ")"


def raw_cycles(inventory_file: Path, n: int) -> list[float]:
    """What a lab script does: SUB the old circuits, ADD the new, *OPC?, then poll PMON until lit."""
    inv = load_inventory(inventory_file).model
    plan = make_plan(load_playbook(PLAYBOOK, inv).model, inv)
    configs = [s.circuits["ocs1"] for s in plan.trials[0].steps if isinstance(s, ApplyStep)]
    with TwinProcess(twin_spec(inv, 0, only={"ocs1"})) as twin:
        host, port = twin.endpoints.devices["ocs1"]["tcp"].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")

        def query(cmd: str) -> str:
            sock.sendall(cmd.encode() + b"\n")
            return reader.readline().decode().strip()

        starts = []
        current: tuple = ()
        for i in range(n):
            target = configs[i % len(configs)]
            starts.append(time.perf_counter())
            old = [pair for pair in current if pair not in target]
            new = [pair for pair in target if pair not in current]
            if old:
                sock.sendall(
                    f":OXC:SWIT:CONN:SUB {chanlist(i for i, _ in old)},{chanlist(e for _, e in old)}\n".encode()
                )
            if new:
                sock.sendall(
                    f":OXC:SWIT:CONN:ADD {chanlist(i for i, _ in new)},{chanlist(e for _, e in new)}\n".encode()
                )
            assert query("*OPC?") == "1"
            egress = [e for _, e in target]
            while min(float(x) for x in query(f":PMON:POW? {chanlist(egress)}").split(",")) < -20:
                time.sleep(0.001)
            current = target
        starts.append(time.perf_counter())
        sock.close()
    return [(b - a) * 1000 for a, b in zip(starts, starts[1:], strict=False)]


def testbed_cycles(inventory_file: Path, n: int, results: Path) -> list[float]:
    inv = load_inventory(inventory_file).model
    plan = make_plan(load_playbook(PLAYBOOK, inv).model, inv, trials=max(1, n // 3))
    options = RunOptions(str(PLAYBOOK), str(inventory_file), results, emulate=True)
    outcome = run_plan(plan, options, Console(file=open(os.devnull, "w")))  # noqa: SIM115
    assert outcome.status == "ok", outcome.error
    events = [json.loads(line) for line in (outcome.run_dir / "events.jsonl").read_text().splitlines()]
    sent = [e["mono_ns"] for e in events if e["type"] == "mark" and e["op"] == "sent" and e.get("trial") is not None]
    return [(b - a) / 1e6 for a, b in zip(sent, sent[1:], strict=False)]


def measure(reconfigs: int = 300, rounds: int = 3, console: Console | None = None) -> dict:
    """Alternating rounds of the raw script and `testbed run`; returns the cycle-time figures in ms."""
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp, ray_session(None):
        inventory = no_jitter_inventory(Path(tmp))
        raw: list[float] = []
        framework: list[float] = []
        for r in range(rounds):
            raw += raw_cycles(inventory, reconfigs)
            framework += testbed_cycles(inventory, reconfigs, Path(tmp) / "results")
            console.print(
                f"round {r + 1}/{rounds}: raw p50 {np.median(raw):.3f} ms, testbed p50 {np.median(framework):.3f} ms"
            )
    raw_a, fw_a = np.asarray(raw), np.asarray(framework)
    result = {
        "raw_p50_ms": float(np.percentile(raw_a, 50)),
        "raw_p99_ms": float(np.percentile(raw_a, 99)),
        "testbed_p50_ms": float(np.percentile(fw_a, 50)),
        "testbed_p99_ms": float(np.percentile(fw_a, 99)),
        "n_raw": len(raw_a),
        "n_testbed": len(fw_a),
    }
    result["overhead_p50_ms"] = result["testbed_p50_ms"] - result["raw_p50_ms"]
    result["overhead_p99_ms"] = result["testbed_p99_ms"] - result["raw_p99_ms"]
    result["ratio_p50"] = result["testbed_p50_ms"] / result["raw_p50_ms"]
    result.update(reconfigs_per_round=reconfigs, rounds=rounds, switching_time_ms=25.0)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reconfigs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    compile_project()  # timed commands start with the project's bytecode, as a user's do
    console = Console()
    result = measure(args.reconfigs, args.rounds, console)
    table = Table(title="OCS reconfiguration cycle time (switching time 25 ms, no jitter)")
    for col in ("driven by", "n", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")
    table.add_row(
        "raw socket script", str(result["n_raw"]), f"{result['raw_p50_ms']:.3f}", f"{result['raw_p99_ms']:.3f}"
    )
    table.add_row(
        "testbed run", str(result["n_testbed"]), f"{result['testbed_p50_ms']:.3f}", f"{result['testbed_p99_ms']:.3f}"
    )
    console.print(table)
    console.print(
        f"framework overhead per reconfiguration: p50 {result['overhead_p50_ms']:.3f} ms "
        f"(target <= 2 ms), p99 {result['overhead_p99_ms']:.3f} ms; ratio p50 {result['ratio_p50']:.3f}"
    )
    write_out("ocs_overhead", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
