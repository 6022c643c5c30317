"""YAML loading that remembers where every key and value came from.

PyYAML's composer gives each node a start mark; we build plain Python data and, beside it, a map
from key path (tuple of keys and list indices) to line number. pydantic's error locations are key
paths too, so every validation error can be reported as `file:line: key.path: message`.

An inventory's shorthands (ranges, groups, patterns: testbed/config/expand.py) are expanded before
validation; the expanded data's key paths then lead, through Origins, back to where they were written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from testbed.contracts.errors import ConfigError, ConfigProblem

Loc = tuple[str | int, ...]

SECRET_KEY = re.compile(r"(?i)(password|passwd|passphrase|secret|token|api[_-]?key)")


@dataclass(frozen=True)
class Origin:
    """Where an expanded key path (a device of a range, a fibre of a pattern, a field from a group) was written.

    source: its key path in the file (for the line); shown: the key path to print instead of the expanded one
    (a pattern's `fibres[0]`, not the 37th fibre it made), or None to print the expanded one (`devices.h017`);
    note: what tells this expansion from its siblings (`with n=5, k=1`); what: the shorthand, when problems
    from its expansions are alike enough to report once (`devices.h[001:256]`), else "".
    """

    source: Loc
    shown: Loc | None
    note: str
    what: str


class LocatedData:
    """Plain data loaded from a YAML file, with the line of every key path."""

    def __init__(self, file: str, data: Any, lines: dict[Loc, int], origins: dict[Loc, Origin] | None = None) -> None:
        self.file = file
        self.data = data
        self.lines = lines
        self.origins = origins or {}

    def expanded(self, data: Any, origins: dict[Loc, Origin]) -> LocatedData:
        """The same file, holding its expanded data."""
        return LocatedData(self.file, data, self.lines, origins)

    def _resolve(self, loc: Loc) -> tuple[Loc, Loc, Origin | None]:
        """(where `loc` was written, the key path to print, its Origin if it was expanded)."""
        loc = tuple(loc)
        for n in range(len(loc), 0, -1) if self.origins else ():
            origin = self.origins.get(loc[:n])
            if origin is not None:
                rest = loc[n:]
                shown = (*origin.shown, *rest) if origin.shown is not None else loc
                return (*origin.source, *rest), shown, origin
        return loc, loc, None

    def line_of(self, loc: Loc) -> int | None:
        """The line of `loc`, or of its closest ancestor that has one."""
        loc = self._resolve(loc)[0]
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)

    def describe(self, loc: Loc) -> str:
        """`loc` as the file names it, for messages that refer to another entry (`fibres[0] with n=1, k=0`)."""
        _, shown, origin = self._resolve(loc)
        return format_loc(shown) + (f" {origin.note}" if origin is not None and origin.note else "")

    def problem(self, loc: Loc, message: str) -> ConfigProblem:
        return self.problems([(loc, message)])[0]

    def problems(self, found: Iterable[tuple[Loc, str]]) -> list[ConfigProblem]:
        """Each (key path, message) at its file:line. A shorthand that expands to many alike problems (a bad field
        in a range of 256 hosts) is reported once, at its line, with how many more it made.
        """
        out: list[ConfigProblem] = []
        alike: dict[tuple, list] = {}  # (line, source key path) -> [first problem, how many more, what]
        for loc, message in found:
            source, shown, origin = self._resolve(loc)
            if origin is not None and origin.note:
                message = f"{origin.note}: {message}"
            problem = ConfigProblem(self.file, self.line_of(loc), format_loc(shown), message)
            if origin is not None and origin.what:
                first = alike.setdefault((problem.line, source), [problem, 0, origin.what])
                if first[0] is not problem:
                    first[1] += 1
                    continue
            out.append(problem)
        for problem, more, what in alike.values():
            if more:
                problem.message += f" (and {more} more from {what})"
        return out


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def load_yaml(path: str | Path) -> LocatedData:
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(name, None, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(name, None, "", f"cannot read file: {exc}")]) from None
    return parse_yaml(text, name)


def parse_yaml(text: str, name: str = "<string>") -> LocatedData:
    try:
        _refuse_deep_nesting(text, name)  # before composing: PyYAML's composer recurses once per level
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigProblem(name, line, "", f"not valid YAML: {problem}")]) from None
    if node is None:
        raise ConfigError([ConfigProblem(name, 1, "", "the file is empty")])
    lines: dict[Loc, int] = {}
    problems: list[ConfigProblem] = []
    try:
        data = _build(node, (), lines, problems, name)
    except _TooLarge:
        raise ConfigError(
            [
                ConfigProblem(
                    name,
                    1,
                    "",
                    f"the document expands to more than {MAX_NODES} values "
                    "(anchors and aliases referring to each other?)",
                )
            ]
        ) from None
    if problems:
        raise ConfigError(problems)
    return LocatedData(name, data, lines)


MAX_NODES = 200_000  # far above any real lab file; a "billion laughs" of aliases stops here
MAX_DEPTH = 64  # mappings and lists inside each other; a lab file nests a handful deep


def _refuse_deep_nesting(text: str, name: str) -> None:
    """ConfigError at the line where the nesting goes deeper than MAX_DEPTH, read from PyYAML's event stream
    (which does not recurse), before anything that does.
    """
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                assert event.start_mark is not None  # the parser marks every event it makes
                line = event.start_mark.line + 1
                raise ConfigError(
                    [ConfigProblem(name, line, "", f"nested more than {MAX_DEPTH} deep: not an inventory or playbook")]
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


class _TooLarge(Exception):
    pass


def _build(node: yaml.Node, loc: Loc, lines: dict[Loc, int], problems: list[ConfigProblem], name: str):
    if len(lines) > MAX_NODES:
        raise _TooLarge
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(
                    ConfigProblem(name, key_node.start_mark.line + 1, format_loc(loc), "keys must be plain scalars")
                )
                continue
            key = _scalar(key_node, problems, name)
            if key in out:
                # PyYAML keeps the last duplicate silently; a lab file with two values for one key
                # is almost always a copy-paste mistake, so refuse it.
                problems.append(
                    ConfigProblem(name, key_node.start_mark.line + 1, format_loc((*loc, key)), "duplicate key")
                )
                continue
            lines[(*loc, key)] = key_node.start_mark.line + 1
            if isinstance(key, str) and SECRET_KEY.fullmatch(key):
                # Files get copied into results, committed and shared; a secret in them leaks.
                problems.append(
                    ConfigProblem(
                        name,
                        key_node.start_mark.line + 1,
                        format_loc((*loc, key)),
                        "secrets are not accepted in YAML files; use key_file or the SSH "
                        "agent, or name an environment variable (e.g. password_env)",
                    )
                )
                continue
            out[key] = _build(value_node, (*loc, key), lines, problems, name)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*loc, i), lines, problems, name) for i, item in enumerate(node.value)]
    return _scalar(node, problems, name)


def _scalar(node: yaml.Node, problems: list[ConfigProblem], name: str):
    """A scalar resolved exactly as yaml.safe_load resolves it (ints, floats, bools, nulls, timestamps);
    an unknown tag such as `!python/object` is a problem at its line, not an exception.
    """
    try:
        value = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        problems.append(
            ConfigProblem(
                name, node.start_mark.line + 1, "", f"cannot read this value: {getattr(exc, 'problem', None) or exc}"
            )
        )
        return None
    try:
        hash(value)
    except TypeError:
        value = str(value)  # only reachable for keys such as a tagged set; keep it printable
    return value


def validate(model: type[BaseModel], located: LocatedData, context: dict | None = None):
    """Validate located data into `model`; every error becomes a ConfigProblem at file:line."""
    try:
        return model.model_validate(located.data, context=context)
    except ValidationError as exc:
        found = [(_data_loc(_error_loc(err), located.data), _message(err)) for err in exc.errors()]
        raise ConfigError(located.problems(found)) from None


def _error_loc(err: ErrorDetails) -> tuple:
    loc = tuple(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        # The problem is the value of the tag key (e.g. `kind: oxc`), so point at that key.
        loc = (*loc, str(err.get("ctx", {}).get("discriminator", "")).strip("'"))
    return loc


def _data_loc(loc: tuple, data: Any) -> Loc:
    """pydantic's error location as a path of the file's keys.

    pydantic inserts names that are not keys of the file (the tag of a discriminated-union member such as
    'ocs', validator names); walk the location against the data and keep only real keys, plus a last key
    that is absent (a missing or misspelt key).
    """
    out: list = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
            out.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            out.append(part)
        elif i == len(loc) - 1:
            out.append(part)
    return tuple(out)


def _message(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; `testbed schema` lists the allowed keys)"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = err.get("input")
    if kind not in ("union_tag_invalid", "value_error") and not isinstance(got, dict | list) and got is not None:
        msg += f" (got {got!r})"
    return msg
