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


def add_tag(run_dir: Path, name: str) -> dict:
    name = name.strip()
    if not name or len(name) > MAX_TAG or any(c.isspace() for c in name):
        raise UserError(
            f"tag {name!r}: a tag is one word of 1 to {MAX_TAG} characters (no spaces); use a note for text"
        )
    return _append(run_dir, {"tag": name})


def add_note(run_dir: Path, text: str) -> dict:
    if not text.strip():
        raise UserError("an empty note; say what to remember about the run")
    return _append(run_dir, {"note": text})


def read_annotations(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(tags, notes) of a run: each {"name"|"text", "wall", "user"}; a tag given twice counts once."""
    tags: dict[str, dict] = {}
    notes: list[dict] = []
    for record in read_jsonl(Path(run_dir) / ANNOTATIONS_FILE, missing_ok=True).records:
        meta = {"wall": record.get("wall"), "user": record.get("user")}
        if isinstance(record.get("tag"), str):
            tags.setdefault(record["tag"], {"name": record["tag"], **meta})
        elif isinstance(record.get("note"), str):
            notes.append({"text": record["note"], **meta})
    return list(tags.values()), notes


def _append(run_dir: Path, record: dict) -> dict:
    record = record | {"wall": time.time(), "user": _user()}
    line = (json.dumps(record) + "\n").encode()
    append(Path(run_dir) / ANNOTATIONS_FILE, line)  # to a regular file of the folder, never through a link
    return record


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None
