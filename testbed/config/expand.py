"""Inventory shorthands, expanded at load into the plain inventory every other part of testbed reads.

- Host ranges: a device key `gpu[001:256]` is one device per name (gpu001 .. gpu256: zero-padded to the width
  of the start when the start has a leading zero, as in Ansible). The range's fields are templates
  (testbed.config.template) over `{name}` and `{i}` (the number). Ranges also work in `spares:`.
- Groups: top-level `groups:` maps a group name to default fields; a device that says `group: hosts` gets every
  field of the group it does not set itself (a field is taken whole: a device's `transport:` replaces the
  group's). Group fields are templates over `{name}` (and `{i}` for a ranged device).
- Patterns: a `fibres:` or `trunks:` entry with `for: {n: 1..256, k: 0..7}` stands for one entry per
  combination (the first variable outermost); its fields are templates over those variables.

A plain device's own fields are taken as written (no templates), so existing files mean what they meant.

Expansion happens before validation, on plain data, so the models, checks, planner and twin only ever see
plain devices and fibres. It records, for every expanded key path, where it was written (an Origin), so a
problem found later is still reported at the file's line, with the pattern's variables.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.config.common import NAME_PATTERN
from testbed.config.template import Template, TemplateError, Value, compile_template
from testbed.config.yamlfile import Loc, LocatedData, Origin, format_loc

MAX_EXPANDED = 100_000  # names and entries one file may expand to: far above any lab, and a bound on memory

_RANGE = re.compile(r"(?P<prefix>[^\[\]]*)\[(?P<start>[0-9]+):(?P<end>[0-9]+)\](?P<suffix>[^\[\]]*)")
_LOOP = re.compile(r"\s*(-?[0-9]{1,18})\s*\.\.\s*(-?[0-9]{1,18})\s*")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(NAME_PATTERN)
PATTERN_LISTS = ("fibres", "trunks")


class _Failed(Exception):
    """A problem at a key path of the file; the entry it is in is skipped."""

    def __init__(self, loc: Loc, message: str) -> None:
        self.loc = loc
        self.message = message


@dataclass(frozen=True)
class NameRange:
    prefix: str
    start: int
    end: int
    width: int  # zero-padded width of the number, 0 for none
    suffix: str

    def names(self) -> list[tuple[str, int]]:
        return [(f"{self.prefix}{i:0{self.width}d}{self.suffix}", i) for i in range(self.start, self.end + 1)]

    def __len__(self) -> int:
        return self.end - self.start + 1

    def contains(self, name: str) -> bool:
        """Whether `name` is one of the range's names, without listing them."""
        if not (name.startswith(self.prefix) and name.endswith(self.suffix)):
            return False
        digits = name[len(self.prefix) : len(name) - len(self.suffix)]
        if not digits.isdigit() or not digits.isascii():
            return False
        number = int(digits)
        return self.start <= number <= self.end and digits == f"{number:0{self.width}d}"


def parse_range(text: str) -> NameRange | None:
    """`gpu[001:256]` as a NameRange; None for a plain name. Raises ValueError for a malformed range."""
    if "[" not in text and "]" not in text:
        return None
    m = _RANGE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a name range: write one [start:end] of integers, e.g. gpu[001:256]")
    first, last = m.group("start"), m.group("end")
    if len(first) > 9 or len(last) > 9:
        raise ValueError(f"range {text!r}: numbers of more than 9 digits")
    start, end = int(first), int(last)
    if start > end:
        raise ValueError(f"range [{first}:{last}] runs backwards (the start is after the end)")
    width = len(first) if first.startswith("0") and len(first) > 1 else 0
    return NameRange(m.group("prefix"), start, end, width, m.group("suffix"))


@dataclass
class Expanded:
    data: dict
    origins: dict[Loc, Origin]
    problems: list[tuple[Loc, str]]  # key paths of the file as written
    shorthands: list[str] = field(default_factory=list)  # what was expanded, e.g. "devices.h[001:256] (256)"


def expand_inventory(located: LocatedData) -> Expanded:
    """The inventory's data with every shorthand expanded (located.data must be a mapping)."""
    return _Expander(located).run()


class _Expander:
    def __init__(self, located: LocatedData) -> None:
        self.located = located
        self.origins: dict[Loc, Origin] = {}
        self.problems: list[tuple[Loc, str]] = []
        self.shorthands: list[str] = []
        self.expanded = 0  # names and entries made so far (bounded by MAX_EXPANDED)

    def run(self) -> Expanded:
        data = dict(self.located.data)
        groups = self._groups(data.pop("groups", None))
        if isinstance(data.get("devices"), dict):
            data["devices"] = self._devices(data["devices"], groups)
        for key in PATTERN_LISTS:
            if isinstance(data.get(key), list):
                data[key] = self._patterns(key, data[key])
        if isinstance(data.get("spares"), list):
            data["spares"] = self._spares(data["spares"])
        return Expanded(data, self.origins, self.problems, self.shorthands)

    def _room(self, count: int) -> bool:
        """Whether `count` more names or entries stay under MAX_EXPANDED (a typo such as [1:1000000000])."""
        self.expanded += count
        return self.expanded <= MAX_EXPANDED

    # --- groups and devices ---------------------------------------------------------------------------------

    def _groups(self, raw: Any) -> dict[str, dict]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problems.append((("groups",), "groups maps a group name to default fields, e.g. hosts: {gpus: 8}"))
            return {}
        groups = {}
        for name, fields in raw.items():
            loc = ("groups", name)
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                self.problems.append((loc, f"{name!r} is not a group name (letters, digits, _ . -)"))
            elif not isinstance(fields, dict):
                self.problems.append((loc, "a group's defaults are a mapping of device fields, e.g. {gpus: 8}"))
            elif "group" in fields:
                self.problems.append(((*loc, "group"), "a group cannot belong to another group"))
            else:
                groups[name] = fields
        return groups

    def _devices(self, devices: dict, groups: dict[str, dict]) -> dict:
        out: dict = {}
        defined: dict[str, Any] = {}  # expanded name -> the key of the file that defines it
        for key, body in devices.items():
            loc = ("devices", key)
            try:
                names = self._names(key, loc)
                self._collisions(key, names, defined)
                ranged = names[0][1] is not None
                known = {"name", "i"} if ranged else {"name"}
                own = _compile(body, known, loc, "") if ranged else body  # a plain device's fields are literal
                group = self._group_of(body, loc, groups, known)
                made = [self._device(key, name, i, own, group) for name, i in names]
            except _Failed as failed:
                if failed.loc[0] == "groups" and any(loc == failed.loc for loc, _ in self.problems):
                    continue  # a group's field is reported once, for the first device that uses it
                self.problems.append((failed.loc, failed.message))
                continue
            for (name, _), device in zip(names, made, strict=True):
                defined[name] = key
                out[name] = device
        return out

    def _names(self, key: Any, loc: Loc) -> Sequence[tuple[Any, int | None]]:
        """The names `key` stands for: itself, or (name, number) for each name of a range."""
        try:
            rng = parse_range(key) if isinstance(key, str) else None
        except ValueError as exc:
            raise _Failed(loc, str(exc)) from None
        if rng is None:
            return [(key, None)]
        if not self._room(len(rng)):
            raise _Failed(loc, f"{key} expands past {MAX_EXPANDED} names and entries in one file")
        self.shorthands.append(f"{format_loc(loc)} ({len(rng)})")
        return rng.names()

    def _collisions(self, key: Any, names: Sequence[tuple[Any, int | None]], defined: dict[str, Any]) -> None:
        clashes = [name for name, _ in names if name in defined]
        if not clashes:
            return
        other = defined[clashes[0]]
        line = self.located.line_of(("devices", other))
        more = f"; {len(clashes) - 1} more of its names are taken too" if len(clashes) > 1 else ""
        raise _Failed(
            ("devices", key),
            f"{clashes[0]} is already defined by devices.{other} (line {line}){more}; define each name once",
        )

    def _group_of(self, body: Any, loc: Loc, groups: dict[str, dict], known: set[str]) -> tuple[str, dict] | None:
        """(group name, its defaults this device does not set, compiled) for a device that says `group:`."""
        if not isinstance(body, dict) or "group" not in body:
            return None
        name = body["group"]
        if not isinstance(name, str) or name not in groups:
            listed = ", ".join(groups) or "none: add a top-level groups: mapping"
            raise _Failed((*loc, "group"), f"no group named {name!r} (groups: {listed})")
        note = f"for {format_loc(loc)}"
        return name, {
            field: _compile(value, known, ("groups", name, field), note)
            for field, value in groups[name].items()
            if field not in body
        }

    def _device(self, key: Any, name: Any, i: int | None, own: Any, group: tuple[str, dict] | None) -> Any:
        """One device of the entry `key`: its own fields (compiled templates when `key` is a range), over its
        group's defaults.
        """
        env: dict[str, Value] = {"name": name} if i is None else {"name": name, "i": i}
        if i is not None:
            self.origins[("devices", name)] = Origin(("devices", key), None, "", f"devices.{key}")
            own = _fill(own, env, ("devices", key), f"for {name}")
        if group is None:
            return own
        gname, defaults = group
        device = {}
        for field_name, value in defaults.items():
            device[field_name] = _fill(value, env, ("groups", gname, field_name), f"for {name}")
            # Only a range's alike problems are reported once: a plain device's are its own.
            what = f"group {gname}" if i is not None else ""
            self.origins[("devices", name, field_name)] = Origin(
                ("groups", gname, field_name), None, f"from group {gname}", what
            )
        device.update((k, v) for k, v in own.items() if k != "group")
        return device

    # --- patterns and spares --------------------------------------------------------------------------------

    def _patterns(self, key: str, entries: list) -> list:
        out: list = []
        for j, entry in enumerate(entries):
            loc = (key, j)
            if not (isinstance(entry, dict) and "for" in entry):
                if len(out) != j:  # shifted by a pattern before it: still reported as written
                    self.origins[(key, len(out))] = Origin(loc, loc, "", "")
                out.append(entry)
                continue
            try:
                loops = self._loops(entry["for"], (*loc, "for"))
                variables = [name for name, _ in loops]
                body = _compile({k: v for k, v in entry.items() if k != "for"}, set(variables), loc, "")
                made = []
                for values in itertools.product(*(values for _, values in loops)):
                    env = dict(zip(variables, values, strict=True))
                    note = "with " + ", ".join(f"{name}={value}" for name, value in env.items())
                    made.append((note, _fill(body, env, loc, note)))
            except _Failed as failed:
                self.problems.append((failed.loc, failed.message))
                continue
            self.shorthands.append(f"{key}[{j}] ({len(made)})")
            for note, rendered in made:
                self.origins[(key, len(out))] = Origin(loc, loc, note, f"the pattern {key}[{j}]")
                out.append(rendered)
        return out

    def _loops(self, raw: Any, loc: Loc) -> list[tuple[str, range]]:
        if not isinstance(raw, dict) or not raw:
            raise _Failed(loc, "for: maps each variable to its values, e.g. {n: 1..256, k: 0..7}")
        loops = []
        count = 1
        for name, spec in raw.items():
            if not isinstance(name, str) or not _VARIABLE.fullmatch(name):
                raise _Failed((*loc, name), f"{name!r} is not a variable name (letters, digits and _)")
            if isinstance(spec, int) and not isinstance(spec, bool):
                values = range(spec, spec + 1)
            else:
                m = _LOOP.fullmatch(spec) if isinstance(spec, str) else None
                if m is None:
                    raise _Failed((*loc, name), f"expected first..last, e.g. 1..256 (inclusive), got {spec!r}")
                first, last = int(m.group(1)), int(m.group(2))
                if first > last:
                    raise _Failed((*loc, name), f"{spec} runs backwards (the first is after the last)")
                values = range(first, last + 1)
            count *= len(values)
            if count > MAX_EXPANDED:
                break
            loops.append((name, values))
        if not self._room(count):
            raise _Failed(loc, f"this pattern expands past {MAX_EXPANDED} names and entries in one file")
        return loops

    def _spares(self, spares: list) -> list:
        out: list = []
        for j, spare in enumerate(spares):
            loc = ("spares", j)
            try:
                names = self._names(spare, loc)
            except _Failed as failed:
                self.problems.append((failed.loc, failed.message))
                continue
            for name, i in names:
                if len(out) != j or i is not None:
                    self.origins[("spares", len(out))] = Origin(loc, loc, "", f"spares[{j}]" if i is not None else "")
                out.append(name)
        return out


def _compile(value: Any, known: set[str], loc: Loc, note: str) -> Any:
    """`value` with every string that has braces compiled to a Template, each checked against the variables
    `known` here: a syntax error or an unknown placeholder is found once, at its key, not once per expansion.
    """
    if isinstance(value, str):
        if "{" not in value and "}" not in value:
            return value
        try:
            template = compile_template(value)
            template.check(known)
        except TemplateError as exc:
            raise _Failed(loc, f"{exc} ({note})" if note else str(exc)) from None
        return template
    if isinstance(value, dict):
        return {k: _compile(v, known, (*loc, k), note) for k, v in value.items()}
    if isinstance(value, list):
        return [_compile(v, known, (*loc, n), note) for n, v in enumerate(value)]
    return value


def _fill(value: Any, env: Mapping[str, Value], loc: Loc, note: str) -> Any:
    """A compiled value rendered with `env`; a problem (division by zero, arithmetic on a name) stops the entry."""
    if isinstance(value, Template):
        try:
            return value.render(env)
        except TemplateError as exc:
            raise _Failed(loc, f"{exc} ({note})") from None
    if isinstance(value, dict):
        return {k: _fill(v, env, (*loc, k), note) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, env, (*loc, n), note) for n, v in enumerate(value)]
    return value


__all__ = ["Expanded", "NameRange", "expand_inventory", "parse_range"]
