"""The results folder of one run: results/<UTC-timestamp>_<playbook>/ with run.json, events.jsonl,
audit.jsonl, trials.csv and summary.json. The format is described in results/README.md.
"""

from __future__ import annotations

import csv
import functools
import getpass
import hashlib
import json
import os
import platform
import secrets
import socket
import subprocess
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Literal

from testbed.events import FORMAT_VERSION, Event, Op, safe_files
from testbed.results.redact import redact
from testbed.results.stats import summarize

PACKAGES = ("testbed", "ray", "pydantic", "pyvisa", "pyvisa-py", "pyserial", "paramiko", "rich", "numpy", "matplotlib")


# Random hex digits in every run id: two runs started in the same instant, in one results folder or in two, get two
# ids, and so two network tags (testbed/twin/netns.py derives a run's tag from its id).
RUN_ID_RANDOM_BYTES = 3


def new_run_id(playbook_name: str) -> str:
    """<UTC time to the millisecond>-<6 random hex digits>_<playbook>: sorts by time, and unique across folders."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")[:-4] + "Z"
    return f"{stamp}-{secrets.token_hex(RUN_ID_RANDOM_BYTES)}_{playbook_name}"


def make_run_dir(root: Path, playbook_name: str) -> tuple[str, Path]:
    """A new run's id and its folder, created here and by no one else (mkdir fails on a folder that exists: the
    run then takes another id, never another run's folder).
    """
    root.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = new_run_id(playbook_name)
        try:
            (root / run_id).mkdir()
        except FileExistsError:  # the same random digits in the same centisecond, or a folder planted in advance
            continue
        return run_id, root / run_id


def run_info(
    run_id: str,
    playbook_file: str,
    playbook: dict,
    inventory_file: str,
    inventory: dict,
    seed: int,
    trials: int,
    emulate: bool,
    ray_address: str | None,
) -> dict:
    return redact(
        {
            "format_version": FORMAT_VERSION,  # of run.json and events.jsonl (testbed/events/schema.py)
            "run": run_id,
            "status": "running",
            "playbook_file": playbook_file,
            "playbook": playbook,
            "inventory_file": inventory_file,
            # What `testbed heal` drives the lab from: this file, if it still holds these bytes (never `inventory`).
            "inventory_source": inventory_source(inventory_file),
            "inventory": inventory,
            "seed": seed,
            "trials": trials,
            "emulate": emulate,
            "ray_address": ray_address,
            "versions": dict(_versions()),
            "git_revision": _git_revision(),
            "host": {
                "hostname": socket.gethostname(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "user": getpass.getuser(),
                "pid": os.getpid(),
            },
            "clock": {
                "wall_start": time.time(),
                "mono_start_ns": time.monotonic_ns(),
                "monotonic": _clock_info("monotonic"),
                "wall": _clock_info("time"),
                "note": "event mono_ns values on one node share one monotonic clock",
            },
        }
    )


def inventory_source(inventory_file: str) -> dict:
    """The inventory file's absolute path and sha256 (both None for an inventory that is no file)."""
    path = Path(inventory_file)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return {"path": None, "sha256": None}
    return {"path": str(path.resolve()), "sha256": digest}


def write_json(path: Path, data: dict) -> None:
    """Written aside under a random name, then renamed: a reader never sees half a file, and a link planted in the
    folder is replaced, never written through (testbed.events.safe_files).
    """
    safe_files.write_json(path, data)


class SummaryCollector:
    """Observer of events: collects measured spans for trials.csv and summary.json."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.trial_status: dict[int | None, str] = {}  # by trial (None: an event outside the trials)
        self.sweep_points: dict[int | None, dict] = {}
        self.crosstalk: dict[str, dict] = {}  # device -> {"source": ..., "worst_db": {port: dB}}
        self.health: dict[str, dict] = {}  # host -> the last health check it answered

    def on_event(self, event: Event) -> None:
        if event.type == "measure":
            self.rows.append(
                {
                    "trial": event.trial,
                    "span": event.op,
                    "step": event.step,
                    "duration_ms": round(event.data["ms"], 6),
                    "start_utc": datetime.fromtimestamp(event.wall, UTC).isoformat(),
                    "sweep": json.dumps(self.sweep_points.get(event.trial, {}), sort_keys=True),
                }
            )
        elif event.op == Op.HEALTH and event.device:
            self.health[event.device] = event.data
        elif event.op == Op.CROSSTALK and event.device:
            entry = self.crosstalk.setdefault(event.device, {"source": event.data.get("source"), "worst_db": {}})
            for port, db in event.data.get("per_port_db", {}).items():
                entry["worst_db"][port] = max(db, entry["worst_db"].get(port, -1e9))
        elif event.op == Op.TRIAL_END:
            self.trial_status[event.trial] = event.data.get("status", "?")
        elif event.op == Op.TRIAL_START:
            self.sweep_points[event.trial] = event.data.get("sweep", {})

    def write_trials_csv(self, path: Path) -> None:
        with safe_files.atomic_writer(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["trial", "sweep", "step", "span", "duration_ms", "start_utc"])
            writer.writeheader()
            writer.writerows(self.rows)

    def summary(self, run_id: str, playbook: str, status: str, planned_trials: int) -> dict:
        spans: dict[str, list[float]] = {}
        for row in self.rows:
            spans.setdefault(row["span"], []).append(row["duration_ms"])
        by_point: dict[str, dict[str, list[float]]] = {}
        for row in self.rows:
            by_point.setdefault(row["sweep"], {}).setdefault(row["span"], []).append(row["duration_ms"])
        out: dict[str, object] = {
            "run": run_id,
            "playbook": playbook,
            "status": status,
            "trials": {
                "planned": planned_trials,
                "ok": sum(1 for s in self.trial_status.values() if s == "ok"),
                "failed": sum(1 for s in self.trial_status.values() if s != "ok"),
            },
            "spans": {name: summarize(values) for name, values in spans.items()},
        }
        by_step: dict[str, dict[str, list[float]]] = {}
        for row in self.rows:
            by_step.setdefault(row["span"], {}).setdefault(row["step"], []).append(row["duration_ms"])
        steps = {span: {step: summarize(v) for step, v in per.items()} for span, per in by_step.items() if len(per) > 1}
        if steps:
            out["by_step"] = steps
        if self.health:
            out["health"] = self.health
        if self.crosstalk:
            out["crosstalk"] = {
                device: {
                    "source": c["source"],
                    "worst_db": dict(sorted(c["worst_db"].items(), key=lambda kv: int(kv[0]))),
                }
                for device, c in self.crosstalk.items()
            }
        if len(by_point) > 1:
            out["sweep"] = [
                {"point": json.loads(point), "spans": {n: summarize(v) for n, v in s.items()}}
                for point, s in by_point.items()
            ]
        return out


# Read once a process: a warm session (testbed serve, testbed.Lab) runs the code it loaded, whatever is installed
# or checked out later, and a queued run's start does not wait on package metadata and two git commands.
@functools.cache
def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@functools.cache
def _git_revision() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _clock_info(name: Literal["monotonic", "time"]) -> dict:
    info = time.get_clock_info(name)
    return {"implementation": info.implementation, "resolution": info.resolution}
