"""Reading a run's JSONL files (events.jsonl, audit.jsonl, twin_truth.jsonl): one reader, one rule.

The recorder writes each line whole, newline included, in one write call, and flushes it. So a kill can leave
one kind of damage only: the last line cut short, without its newline (torn). The rule, for every reader:
- a torn last line is left out and reported (`JsonlFile.torn`); `testbed heal` sets it aside on disk;
- any other line that is not a JSON object is damage no kill explains: JsonlError names file:line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.events.safe_files import (
    MAX_LINE_BYTES,
    UnsafeFile,
    append,
    iter_lines,
    nested_too_deep,
    open_fd,
    too_deep,
)


class JsonlError(UserError):
    """A line of a run's JSONL file is damaged beyond a torn last line."""


@dataclass
class JsonlFile:
    path: Path
    records: list[dict] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # each record's 1-based line number
    torn: str | None = None  # what was left out, for the reader's report

    def numbered(self) -> list[tuple[int, dict]]:
        return list(zip(self.lines, self.records, strict=True))


def read_jsonl(path: Path, *, missing_ok: bool = False) -> JsonlFile:
    """Every record of a JSONL file, by the rule above, read line by line (testbed.events.safe_files: a link, a
    FIFO, a device, a line or a file over its limit is refused). A missing file is an error unless missing_ok.
    """
    path = Path(path)
    out = JsonlFile(path)
    try:
        for number, raw in enumerate(iter_lines(path), 1):
            if raw.endswith(b"\n"):
                _parse(out, path, number, raw)
            elif raw.strip():  # bytes after the last newline: a torn line, unless they parse
                try:
                    _parse(out, path, number, raw)
                except JsonlError:
                    out.torn = (
                        f"{path.name}: its last line is torn ({len(raw)} bytes, no newline: the writer was killed); "
                        "left out (`testbed heal` sets it aside)"
                    )
    except FileNotFoundError:
        if missing_ok:
            return out
        raise JsonlError(f"{path}: no such file; pass a folder `testbed run` wrote") from None
    return out


def _parse(out: JsonlFile, path: Path, number: int, raw: bytes) -> None:
    if not raw.strip():
        return
    try:
        text = raw.decode("utf-8")  # a run writes UTF-8 (JSON's own rule): no guessing of the encoding line by line
        record = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonlError(
            f"{path}:{number}: not a JSON line ({exc}); the file is damaged beyond a torn last line"
        ) from None
    except RecursionError:
        raise JsonlError(str(too_deep(f"{path}:{number}"))) from None
    if nested_too_deep(record, text):
        raise JsonlError(str(too_deep(f"{path}:{number}")))
    if not isinstance(record, dict):
        raise JsonlError(f"{path}:{number}: a JSON {type(record).__name__}, not an object")
    out.records.append(record)
    out.lines.append(number)


def set_aside_torn_line(path: Path) -> str | None:
    """Move a torn last line to PATH.torn, so that what is appended next starts on a line of its own and every
    line left parses. Returns what was done (None: nothing was torn). Neither file is reached through a link.
    """
    try:
        fd = open_fd(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return None
        # The torn line starts after the last newline: read back from the end, a chunk at a time.
        keep, position = 0, size
        while position > 0:
            start = max(0, position - (1 << 20))
            f.seek(start)
            newline = f.read(position - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        if size - keep > MAX_LINE_BYTES:
            raise UnsafeFile(f"{path}: a torn last line of {size - keep} bytes, over the limit of {MAX_LINE_BYTES}")
        f.seek(keep)
        fragment = f.read()
        append(Path(str(path) + ".torn"), fragment + b"\n")
        f.truncate(keep)
    return f"{path.name}: its last line was torn ({len(fragment)} bytes, no newline); set aside in {path.name}.torn"


# An event's envelope as the recorder writes it (testbed/events/record.py): field -> its type, and whether required.
_ENVELOPE: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "seq": (int, True),
    "type": (str, True),
    "op": (str, True),
    "mono_ns": (int, True),
    "wall": ((int, float), True),
    "run": (str, True),
    "trial": (int, False),
    "step": (str, False),
    "node": (str, False),
    "device": (str, False),
    "data": (dict, False),
}
_TYPES = ("invoke", "ok", "fail", "info", "mark", "measure")


def read_events(path: Path) -> JsonlFile:
    """A run's events.jsonl by the rule above, each line an event as the recorder writes it (its envelope: the
    fields and their types, the sequence numbers rising); JsonlError names the file, the line and the field.
    """
    out = read_jsonl(path)
    last = 0
    for number, record in out.numbered():
        problem = _envelope_problem(record)
        if problem is None and record["seq"] <= last:
            problem = f"seq {record['seq']} after seq {last}: sequence numbers rise"
        if problem is not None:
            raise JsonlError(f"{path}:{number}: {problem}; the history is damaged (not a line the recorder writes)")
        last = record["seq"]
        if record.get("data") is None:  # optional in the envelope: every reader reads it as an object
            record["data"] = {}
    return out


def _envelope_problem(record: dict) -> str | None:
    for name, (types, required) in _ENVELOPE.items():
        if name not in record:
            if required:
                return f"no {name!r}"
            continue
        value = record[name]
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{name!r} is {json.dumps(value)[:40]}, not {_kind(types)}"
    if record["type"] not in _TYPES:
        return f"'type' is {json.dumps(record['type'])[:40]}, not one of {', '.join(_TYPES)}"
    return None


def _kind(types) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object"}
    return " or ".join(names[t] for t in (types if isinstance(types, tuple) else (types,)))
