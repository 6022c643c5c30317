"""A run folder read into the catalog's rows (testbed.catalog.schema), or the reason it is not indexed.

The folder is the source of truth (results/README.md describes it): run.json for identity and provenance,
events.jsonl for the spans, trials, milestones and faults, annotations.jsonl for tags and notes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.catalog.annotations import ANNOTATIONS_FILE, read_annotations, read_params
from testbed.events import JsonlError, Op, read_events, read_faults
from testbed.events.safe_files import UnsafeFile, loads, read_bytes
from testbed.families import FAMILIES
from testbed.results.milestones import MILESTONES

RUN_FILE = "run.json"
EVENTS_FILE = "events.jsonl"
_MILESTONES = frozenset(MILESTONES)


class NotIndexed(Exception):  # noqa: N818 (a reason, not an error: the folder is reported and skipped)
    """A folder the catalog leaves out: not a run, or damaged; the message says which and why."""


@dataclass
class RunRows:
    """One run as the catalog's rows: `run` for the runs table, the rest a list of rows per child table."""

    run: dict
    children: dict[str, list[dict]] = field(default_factory=dict)


def signature(run_dir: Path) -> str:
    """What the folder's indexed files look like now (their owners included: a chown changes no mtime): a changed
    signature means index it again.
    """
    parts = [str(_uid(run_dir))]
    for name in (RUN_FILE, EVENTS_FILE, ANNOTATIONS_FILE):
        try:
            st = os.stat(run_dir / name, follow_symlinks=False)
            parts.append(f"{st.st_uid}:{st.st_size}:{st.st_mtime_ns}")
        except FileNotFoundError:
            parts.append("-")
    return "/".join(parts)


MIXED_OWNERS = -1


def owner_uid(run_dir: Path) -> int:
    """The account that owns the folder and each file the catalog reads from it; MIXED_OWNERS when they differ (a
    file another account put in it, or a folder of ours holding another's run).
    """
    uids = {_uid(run_dir)}
    for name in (RUN_FILE, EVENTS_FILE, ANNOTATIONS_FILE):
        try:
            uids.add(os.stat(run_dir / name, follow_symlinks=False).st_uid)
        except FileNotFoundError:
            pass
    return uids.pop() if len(uids) == 1 else MIXED_OWNERS


def _uid(path: Path) -> int:
    return os.stat(path, follow_symlinks=False).st_uid


def read_run(run_dir: Path, indexed_at: float) -> RunRows:
    """The catalog's rows for one run folder; NotIndexed when it is not a run or is damaged."""
    run_dir = Path(run_dir)
    sig = signature(run_dir)  # before reading: a change while reading makes the next sync read it again
    info = _run_json(run_dir)
    try:
        events = read_events(run_dir / EVENTS_FILE) if (run_dir / EVENTS_FILE).is_file() else None
    except (JsonlError, UnsafeFile, OSError) as exc:
        raise NotIndexed(f"damaged: {exc}") from None
    try:
        tags, notes = read_annotations(run_dir)
        params = read_params(run_dir)
    except (JsonlError, UnsafeFile, OSError) as exc:
        raise NotIndexed(f"damaged: {exc}") from None
    records = events.records if events is not None else []
    folder = run_dir.name
    commit, dirty = _commit(info.get("git_revision"))
    host, playbook, inventory = _section(info, "host"), _section(info, "playbook"), _section(info, "inventory")
    versions, clock = _section(info, "versions"), _section(info, "clock")
    trials = _trials(records)
    walls = [r["wall"] for r in records]
    run = {
        "folder": folder,
        "run_id": str(info["run"]),
        "status": info.get("status"),
        "error": info.get("error"),
        "playbook": playbook.get("name"),
        "playbook_file": info.get("playbook_file"),
        "inventory": inventory.get("name"),
        "inventory_digest": _digest(inventory),
        "inventory_file": info.get("inventory_file"),
        "target": "twin" if info.get("emulate") else "lab",
        "seed": _int(info.get("seed")),
        "trials_planned": _int(info.get("trials")),
        "trials_ok": sum(1 for t in trials if t["status"] == "ok"),
        "trials_failed": sum(1 for t in trials if t["status"] not in (None, "ok")),
        "git_commit": commit,
        "git_dirty": dirty,
        "testbed_version": versions.get("testbed"),
        "versions": json.dumps(versions, sort_keys=True),
        "user": host.get("user"),
        "host": host.get("hostname"),
        "started": _float(clock.get("wall_start")) or (min(walls) if walls else None),
        "ended": max(walls) if walls else None,
        "format_version": _int(info.get("format_version")),
        "torn": events.torn if events is not None else None,
        "owner_uid": owner_uid(run_dir),
        "signature": sig,
        "indexed_at": indexed_at,
    }
    children = {
        "devices": _devices(inventory, info.get("twin")),
        "trials": trials,
        "spans": [
            {
                "trial": r.get("trial"),
                "step": r.get("step"),
                "span": r["op"],
                "ms": float(r["data"]["ms"]),
                "wall": r["wall"],
            }
            for r in records
            if r["type"] == "measure" and isinstance((r.get("data") or {}).get("ms"), int | float)
        ],
        "milestones": [
            {
                "trial": r.get("trial"),
                "name": r["op"],
                "device": r.get("device"),
                "mono_ns": r["mono_ns"],
                "wall": r["wall"],
            }
            for r in records
            if r["type"] == "mark" and r["op"] in _MILESTONES
        ],
        "faults": _faults(records),
        "tags": tags,
        "notes": notes,
        "params": [{"name": k, "value": v} for k, v in params.items()],
    }
    return RunRows(run, children)


def run_labels(run_dir: Path) -> dict:
    """What tells a run apart from the other runs of its playbook, for its own report: its inventory (name, content
    digest, file), lab or twin, tags, params and notes. What a damaged or older folder does not say is left out.
    """
    try:
        info = _run_json(run_dir)
    except NotIndexed:
        info = {}
    inventory = _section(info, "inventory")
    out: dict[str, Any] = {
        "inventory": inventory.get("name"),
        "inventory_digest": _digest(inventory),
        "inventory_file": info.get("inventory_file"),
        "target": None if "emulate" not in info else "twin" if info["emulate"] else "lab",
    }
    try:
        tags, notes = read_annotations(run_dir)
        out |= {"tags": [t["name"] for t in tags], "notes": notes, "params": read_params(run_dir)}
    except (JsonlError, UnsafeFile, OSError) as exc:
        out["annotations_error"] = str(exc)
    return out


def _digest(section: dict) -> str | None:
    """An inventory's content digest: two inventories of one name (a copy with a slower switch) are two."""
    if not section:
        return None
    return hashlib.sha256(json.dumps(section, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _run_json(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        raise NotIndexed("not a run: not a folder")
    try:
        info = loads(read_bytes(path), str(path))  # never through a link, nor from a FIFO, nor too large or deep
    except FileNotFoundError:
        raise NotIndexed(f"not a run: no {RUN_FILE}") from None
    except UnsafeFile as exc:
        raise NotIndexed(f"damaged: {exc}") from None
    except OSError as exc:
        raise NotIndexed(f"damaged: {path}: {exc}") from None
    if not isinstance(info, dict) or not isinstance(info.get("run"), str) or "format_version" not in info:
        raise NotIndexed(f"damaged: {path}: not a run's run.json (no 'run' id or 'format_version')")
    return info


def _trials(records: list[dict]) -> list[dict]:
    trials: dict[int, dict] = {}
    for r in records:
        if r["type"] != "mark" or not isinstance(r.get("trial"), int):
            continue
        data = r.get("data") or {}
        if r["op"] == Op.TRIAL_START:
            sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
            trials[r["trial"]] = {"trial": r["trial"], "sweep": json.dumps(sweep, sort_keys=True), "status": None}
        elif r["op"] == Op.TRIAL_END and r["trial"] in trials:
            trials[r["trial"]]["status"] = data.get("status")
    return list(trials.values())


def _devices(inventory: dict, twin) -> list[dict]:
    devices = _section(inventory, "devices")
    served = (twin or {}).get("devices", {}) if isinstance(twin, dict) else {}
    rows = []
    for name, device in devices.items():
        device = device if isinstance(device, dict) else {}
        transport = _section(device, "transport")
        interface = served.get(name, {}).get("interfaces") if isinstance(served.get(name), dict) else None
        rows.append(
            {
                "name": name,
                "kind": device.get("kind"),
                "switch": _holds_fabric(device.get("kind")),
                "driver": device.get("driver"),
                "transport": transport.get("type"),
                "interface": interface if isinstance(interface, str) else None,
            }
        )
    return rows


def _holds_fabric(kind) -> int | None:
    if not isinstance(kind, str) or kind not in FAMILIES:
        return None
    return int(FAMILIES.get(kind).holds_fabric)


def _faults(records: list[dict]) -> list[dict]:
    """One row per injection (testbed/events/faults.py): its outcome (ok, fail, info; None: never answered) and its
    heal's.
    """
    return [
        {
            "trial": f.trial,
            "fault": f.key,
            "kind": f.kind,
            "target": f.target,
            "injected": f.injected,
            "healed": f.healed,
            "inject_wall": f.inject_wall,
            "heal_wall": f.heal_wall,
        }
        for f in read_faults(records)
    ]


def _commit(revision) -> tuple[str | None, int | None]:
    if not isinstance(revision, str) or not revision:
        return None, None
    dirty = revision.endswith("-dirty")
    return revision.removesuffix("-dirty"), int(dirty)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def iso(wall: float | None) -> str | None:
    """A wall time as UTC ISO 8601 (how the catalog's answers show times)."""
    return None if wall is None else datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")


def _section(info: dict[str, Any], key: str) -> dict[str, Any]:
    """run.json's `key` section, or {} when it is missing or not an object (a damaged or older folder)."""
    value = info.get(key)
    return value if isinstance(value, dict) else {}
