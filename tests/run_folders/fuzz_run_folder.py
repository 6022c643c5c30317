"""Mutations of a real run folder's run.json and events.jsonl through `testbed check`, `testbed replay` and
`testbed heal` (in-process, through testbed.cli.main.main): every answer must be an exit code, never a traceback.
Seeded, so a failure is reproduced by its seed and number.

    python tests/run_folders/fuzz_run_folder.py RUN_DIR [--mutations 1000] [--seed 37]

A mutation replaces one value anywhere in run.json, or in one line of events.jsonl, by a value of another type
(null, a boolean, a huge or non-finite number, a string, a list, an object, deep nesting), or deletes its key.
Each command gets a fresh copy of the mutated folder (heal writes into the folder it heals).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

COMMANDS = ("check", "replay", "heal")
FILES = ("run.json", "events.jsonl")

# The events check and heal act on (and not only read): half the mutations of events.jsonl go to one of these.
ACTED_ON = ("fabric.", "fault.", "gpu.start_job", "gpu.stop_job", "run.", "trial.", "ocs.identify", "job")

REPLACEMENTS = (
    None,
    True,
    False,
    0,
    -1,
    2**70,
    1e308,
    -1e308,
    "1e999",  # written as a bare number: JSON reads it back as infinity
    "",
    "x",
    "/dev/zero",
    "a" * 300,
    [],
    ["x"],
    [None],
    {},
    {"x": None},
    "deep",  # nested 40 deep: within the depth limit, deeper than any record a run writes
)


@dataclass
class Outcome:
    tracebacks: list[str] = field(default_factory=list)  # "file/command/mutation: the exception's last line"
    exits: dict[int, int] = field(default_factory=dict)  # exit code -> how many
    mutations: int = 0


def _paths(value, prefix=()) -> Iterator[tuple]:
    """Every path to a value inside a JSON document (keys and list indices), itself included."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


def _replacement(rng: random.Random):
    choice = rng.choice(REPLACEMENTS)
    if choice == "deep":
        value: object = 1
        for _ in range(40):
            value = [value]
        return value
    return choice


def _mutate(document, rng: random.Random) -> tuple[object, str]:
    """The document with one value changed (or a key deleted), and what was done. The value is chosen among the
    top-level keys first, then anywhere inside the one chosen: run.json's inventory (most of its values) would
    otherwise take nearly every mutation.
    """
    if isinstance(document, dict) and document and rng.random() < 0.7:
        key = rng.choice(list(document))
        paths = list(_paths(document[key], (key,)))
    else:
        paths = [p for p in _paths(document) if p]
    path = rng.choice(paths)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and rng.random() < 0.15:
        del parent[path[-1]]
        return document, f"{'.'.join(map(str, path))}: deleted"
    value = _replacement(rng)
    parent[path[-1]] = value
    return document, f"{'.'.join(map(str, path))} = {json.dumps(value)[:40]}"


def _dump(document) -> str:
    return json.dumps(document).replace('"1e999"', "1e999")


def mutate_folder(source: Path, target: Path, rng: random.Random) -> str:
    """A copy of `source` at `target` with one mutation; returns what it was."""
    shutil.copytree(source, target, symlinks=True)
    name = rng.choice(FILES)
    if name == "run.json":
        document, what = _mutate(json.loads((target / name).read_text()), rng)
        (target / name).write_text(_dump(document))
        return f"run.json {what}"
    lines = (target / name).read_text().splitlines()
    died = ""
    if rng.random() < 0.5:  # the runner died after this line: heal has a run to heal, with the mutation in it
        lines = lines[: rng.randrange(1, len(lines) + 1)]
        died = f" (cut after line {len(lines)})"
    acted_on = [n for n, line in enumerate(lines) if any(f'"op": "{op}' in line for op in ACTED_ON)]
    number = rng.choice(acted_on) if acted_on and rng.random() < 0.5 else rng.randrange(len(lines))
    document, what = _mutate(json.loads(lines[number]), rng)
    lines[number] = _dump(document)
    (target / name).write_text("\n".join(lines) + "\n")
    return f"events.jsonl:{number + 1} {what}{died}"


def run_command(command: str, folder: Path) -> tuple[int | None, str | None]:
    """(exit code, None) or (None, the traceback's last line) for one command on one folder, in this process."""
    from testbed.cli.main import main

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return main([command, str(folder)]), None
    except SystemExit as exc:  # argparse's own exit: not ours to hide
        return int(exc.code or 0), None
    except BaseException as exc:  # noqa: BLE001 - the very thing the fuzz looks for
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, "".join(traceback.format_exception_only(exc)).strip().splitlines()[-1][:300]


def fuzz(run_dir: Path, mutations: int, seed: int, work: Path) -> Outcome:
    rng = random.Random(seed)
    outcome = Outcome()
    for n in range(mutations):
        base = work / f"m{n}"
        what = mutate_folder(run_dir, base / "source" / run_dir.name, rng)
        for command in COMMANDS:
            folder = base / command / run_dir.name
            shutil.copytree(base / "source" / run_dir.name, folder, symlinks=True)
            code, error = run_command(command, folder)
            if error is not None:
                outcome.tracebacks.append(f"#{n} {what} | {command}: {error}")
            else:
                outcome.exits[code] = outcome.exits.get(code, 0) + 1
        shutil.rmtree(base)
        outcome.mutations += 1
    return outcome


@contextlib.contextmanager
def private_machine_state(work: Path) -> Iterator[None]:
    """Heal of a mutated folder may take lab leases and device locks: in the fuzz's own folders, not the machine's."""
    saved = {k: os.environ.get(k) for k in ("TESTBED_LEASE_DIR", "TESTBED_LOCK_DIR")}
    os.environ["TESTBED_LEASE_DIR"] = str(work / "leases")
    os.environ["TESTBED_LOCK_DIR"] = str(work / "locks")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a real run folder (`testbed run ... --emulate` wrote it)")
    parser.add_argument("--mutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="testbed-fuzz-") as work, private_machine_state(Path(work)):
        outcome = fuzz(args.run_dir, args.mutations, args.seed, Path(work))
    for line in outcome.tracebacks:
        print(line)
    print(
        f"{outcome.mutations} mutations x {len(COMMANDS)} commands: {len(outcome.tracebacks)} tracebacks; "
        f"exit codes {dict(sorted(outcome.exits.items()))}"
    )
    return 1 if outcome.tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
