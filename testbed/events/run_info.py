"""A run's run.json read back (by check, replay and heal): its fields, and their types, as `testbed run` writes
them (testbed/results/folder.py `run_info`, and what the runner adds as it goes).

run.json is input like any file of a run folder (docs/run-folders.md): a field of another type than the runner
writes is refused here, naming the file and the field, so that no reader meets a list where it expects a seed.
Only the type of what is there is checked: an older run's run.json lacks fields a newer one has.
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.events.safe_files import read_json_object

_STR, _INT, _DICT, _BOOL = (str,), (int,), (dict,), (bool,)

# field -> its type(s); None is allowed for every field but `run` and `inventory` (the runner writes null for
# what it does not know: no Ray address, no pid yet).
_FIELDS: dict[str, tuple[type, ...]] = {
    "run": _STR,
    "inventory": _DICT,
    "format_version": _INT,
    "status": _STR,
    "error": _STR,
    "playbook": _DICT,
    "playbook_file": _STR,
    "inventory_file": _STR,
    "seed": _INT,
    "trials": _INT,
    "emulate": _BOOL,
    "ray_address": _STR,
    "git_revision": _STR,
    "versions": _DICT,
    "host": _DICT,
    "clock": _DICT,
    "runner": _DICT,
    "twin": _DICT,
    "twin_pid": _INT,
    "ray": _DICT,
    "healed": _DICT,
}
_REQUIRED = ("run", "inventory")
# Inside the sections readers act on: section -> field -> type(s) (None allowed).
_SECTIONS: dict[str, dict[str, tuple[type, ...]]] = {
    "playbook": {"name": _STR},
    "host": {"hostname": _STR, "user": _STR, "pid": _INT},
    "runner": {"hostname": _STR, "pid": _INT, "start_ticks": _INT},
    "twin": {"control": _STR, "devices": _DICT, "netns": _DICT},
    "ray": {"session_dir": _STR},
}


class RunInfoError(UserError):
    """run.json holds a field of a type `testbed run` never writes there."""


def read_run_info(run_dir: Path) -> dict:
    """RUN_DIR/run.json, read safely (testbed.events.safe_files) and its fields' types checked. An OSError of the
    open (no such file) passes through: the caller says what a folder without run.json is.
    """
    path = Path(run_dir) / "run.json"
    info = read_json_object(path)
    problem = run_info_problem(info)
    if problem is not None:
        raise RunInfoError(f"{path}: {problem}; not a run.json `testbed run` writes (damaged, or forged)")
    return info


def run_info_problem(info: dict) -> str | None:
    """What is wrong with run.json's fields (None: nothing)."""
    for name in _REQUIRED:
        if info.get(name) is None:
            return f"no {name!r}"
    for name, types in _FIELDS.items():
        problem = _wrong(name, info.get(name), types)
        if problem:
            return problem
    for section, fields in _SECTIONS.items():
        value = info.get(section)
        if not isinstance(value, dict):
            continue
        for name, types in fields.items():
            problem = _wrong(f"{section}.{name}", value.get(name), types)
            if problem:
                return problem
    return None


def _wrong(name: str, value, types: tuple[type, ...]) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) and bool not in types:  # a bool is an int to Python, never to run.json
        return f"{name!r} is {json.dumps(value)}, not {_kind(types)}"
    if not isinstance(value, types):
        return f"{name!r} is {json.dumps(value, default=str)[:40]}, not {_kind(types)}"
    return None


def _kind(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", dict: "an object", bool: "true or false"}
    return " or ".join(names[t] for t in types)
