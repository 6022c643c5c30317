"""Loading the 2048-GPU Opus inventory: its shorthand file against the same lab written out plainly.

`playbooks/inventory/opus-2048.yaml` describes 264 devices and 2048 fibres in a few dozen lines of ranges and
groups (docs: the inventory's shorthands); `bench/opus_scale.py`'s `inventory_data(256)` is the same lab as plain
data, which is written here as YAML (the file a user without the shorthands would keep, ~15,000 lines). In
alternating rounds, in this process:
- shorthand: `load_inventory(opus-2048.yaml)` (parse, expand, validate), then `make_plan` of
  `playbooks/gpu-health.yaml` against it, as `testbed validate` / `testbed run` start;
- plain: `load_inventory` of the plain file, then the same plan.
Both must give the same devices and fibres. Reported: p50 and max of each phase, and the shorthand's load+plan
against the plain file's (the ratio); target: the shorthand's load p50 <= 2 s and load+plan p50 <= 3 s (the
bound tests/config/test_inventory_shorthands.py once asserted, a speed figure that belongs here).

    python bench/inventory_load.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import REPO, compile_project, machine, stats, write_out
from opus_scale import inventory_data

from testbed.documents import load_inventory, load_playbook
from testbed.plan import make_plan

OPUS = REPO / "playbooks/inventory/opus-2048.yaml"
PLAYBOOK = REPO / "playbooks/gpu-health.yaml"
TARGET_LOAD_S, TARGET_TOTAL_S = 2.0, 3.0


def load_and_plan(inventory: Path) -> tuple[float, float, object]:
    """(seconds to load the inventory, seconds to load and plan, the inventory)."""
    start = time.perf_counter()
    inv = load_inventory(inventory).model
    loaded = time.perf_counter() - start
    plan = make_plan(load_playbook(PLAYBOOK, inv).model, inv)
    total = time.perf_counter() - start
    if plan.inventory is not inv:
        raise RuntimeError("the plan is not of the inventory just loaded")
    return loaded, total, inv


def measure(rounds: int = 5) -> dict:
    with tempfile.TemporaryDirectory(prefix="inventory-load-") as tmp:
        plain = Path(tmp) / "opus-plain.yaml"
        plain.write_text(yaml.safe_dump(inventory_data(256), sort_keys=False))
        times: dict[str, dict[str, list[float]]] = {
            name: {"load_s": [], "total_s": []} for name in ("shorthand", "plain")
        }
        for _ in range(rounds):
            loaded = {}
            for name, path in (("shorthand", OPUS), ("plain", plain)):
                load_s, total_s, inv = load_and_plan(path)
                times[name]["load_s"].append(load_s)
                times[name]["total_s"].append(total_s)
                loaded[name] = inv
            if loaded["shorthand"].devices != loaded["plain"].devices or (
                loaded["shorthand"].fibres != loaded["plain"].fibres
            ):
                raise RuntimeError("the shorthand file and the plain one describe different labs")
        p50 = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
        return {
            "rounds": rounds,
            "plain_lines": len(plain.read_text().splitlines()),
            "shorthand_lines": len(OPUS.read_text().splitlines()),
            "seconds": {name: {k: stats(v) for k, v in t.items()} for name, t in times.items()},
            "p50_s": p50,
            "ratio_total_shorthand_vs_plain": p50["shorthand"]["total_s"] / p50["plain"]["total_s"],
            "target": {"load_s": TARGET_LOAD_S, "total_s": TARGET_TOTAL_S},
            "met": p50["shorthand"]["load_s"] <= TARGET_LOAD_S and p50["shorthand"]["total_s"] <= TARGET_TOTAL_S,
            "machine": machine(),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    compile_project()
    figures = measure(args.rounds)
    print(json.dumps({k: v for k, v in figures.items() if k != "machine"}, indent=2))
    write_out("inventory_load", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
