"""Tags and notes on a run, kept in the run's own folder (annotations.jsonl) so that a reindex keeps them.

One JSON line per tag or note, appended in a single write: two users tagging at once never tear a line.
"""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.events import read_jsonl
from testbed.events.safe_files import append

ANNOTATIONS_FILE = "annotations.jsonl"
MAX_TAG = 100


def add_tag(run_dir: Path, name: str, *, user: str | None = None) -> dict:
    name = name.strip()
    if not name or len(name) > MAX_TAG or any(c.isspace() for c in name):
        raise UserError(
            f"tag {name!r}: a tag is one word of 1 to {MAX_TAG} characters (no spaces); use a note for text"
        )
    return _append(run_dir, {"tag": name}, user)


def remove_tag(run_dir: Path, name: str) -> dict:
    """Take a tag off a run: an `untag` line appended (the file only grows: what was tagged when stays readable).
    UserError listing the run's tags when it has not this one.
    """
    tags = [t["name"] for t in read_annotations(run_dir)[0]]
    if name not in tags:
        raise UserError(f"{Path(run_dir).name} has no tag {name!r}; its tags: {', '.join(tags) or 'none'}")
    return _append(run_dir, {"untag": name})


def add_param(run_dir: Path, name: str, value: str, *, user: str | None = None) -> dict:
    """A parameter of the run (`testbed run --param k=v`): what the playbook does not say about it (the fibre
    length, the firmware build); the last value given for a name is its value.
    """
    name = name.strip()
    if not name or len(name) > MAX_TAG or any(c.isspace() for c in name) or "=" in name:
        raise UserError(f"param {name!r}: a name is one word of 1 to {MAX_TAG} characters, then =VALUE")
    return _append(run_dir, {"param": {"name": name, "value": str(value)}}, user)


def parse_params(items: list[str] | None) -> dict[str, str]:
    """--param KEY=VALUE items as {key: value}; UserError for an item that is not KEY=VALUE."""
    params: dict[str, str] = {}
    for item in items or ():
        key, eq, value = str(item).partition("=")
        if not eq or not key.strip():
            raise UserError(f"--param {item!r}: give KEY=VALUE, e.g. --param fibre_m=20")
        params[key.strip()] = value.strip()
    return params


def read_params(run_dir: Path) -> dict[str, str]:
    """The run's parameters {name: value} (the last given for a name wins)."""
    params: dict[str, str] = {}
    for record in read_jsonl(Path(run_dir) / ANNOTATIONS_FILE, missing_ok=True).records:
        param = record.get("param")
        if isinstance(param, dict) and isinstance(param.get("name"), str):
            params[param["name"]] = str(param.get("value"))
    return params


def add_note(run_dir: Path, text: str, *, user: str | None = None) -> dict:
    if not text.strip():
        raise UserError("an empty note; say what to remember about the run")
    return _append(run_dir, {"note": text}, user)


def read_annotations(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(tags, notes) of a run: each {"name"|"text", "wall", "user"}; a tag given twice counts once, a tag taken off
    (`untag`) is gone until given again.
    """
    tags: dict[str, dict] = {}
    notes: list[dict] = []
    for record in read_jsonl(Path(run_dir) / ANNOTATIONS_FILE, missing_ok=True).records:
        meta = {"wall": record.get("wall"), "user": record.get("user")}
        if isinstance(record.get("tag"), str):
            tags.setdefault(record["tag"], {"name": record["tag"], **meta})
        elif isinstance(record.get("untag"), str):
            tags.pop(record["untag"], None)
        elif isinstance(record.get("note"), str):
            notes.append({"text": record["note"], **meta})
    return list(tags.values()), notes


def _append(run_dir: Path, record: dict, user: str | None = None) -> dict:
    """`user`: whom the annotation is from, where it is not this process's account (testbed serve writes what a
    submitted run was given as the account that submitted it).
    """
    record = record | {"wall": time.time(), "user": user or _user()}
    line = (json.dumps(record) + "\n").encode()
    append(Path(run_dir) / ANNOTATIONS_FILE, line)  # to a regular file of the folder, never through a link
    return record


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None
