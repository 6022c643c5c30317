"""Loading and validating inventories and playbooks (re-exported by testbed.documents)."""

from __future__ import annotations

import difflib
from pathlib import Path

from testbed.config.expand import expand_inventory
from testbed.config.yamlfile import LocatedData, format_loc, load_yaml, validate
from testbed.contracts.errors import ConfigError, ConfigProblem
from testbed.documents.checks import check_inventory, check_playbook
from testbed.documents.inventory import Inventory
from testbed.documents.playbook import Playbook

__all__ = [
    "Inventory",
    "Playbook",
    "load_inventory",
    "load_playbook",
    "detect_kind",
    "declared_inventory",
    "Loaded",
]


class Loaded:
    """A validated model and the file it came from (for locating later problems)."""

    def __init__(self, model, located: LocatedData, shorthands: list[str] | None = None) -> None:
        self.model = model
        self.located = located
        self.shorthands = shorthands or []  # what an inventory expanded, e.g. "devices.h[001:256] (256)"

    @property
    def path(self) -> str:
        return self.located.file

    def summary(self) -> str:
        """What `testbed validate` prints beside `ok`: for an inventory, what it holds once expanded."""
        if not isinstance(self.model, Inventory):
            return "playbook"
        inv = self.model
        parts = [f"{len(inv.devices)} devices", f"{len(inv.fibres)} fibres"]
        parts += [f"{len(inv.trunks)} trunks"] if inv.trunks else []
        text = "inventory: " + ", ".join(parts)
        return text + (f"; expanded from {', '.join(self.shorthands)}" if self.shorthands else "")


def load_inventory(path: str | Path) -> Loaded:
    located = load_yaml(path)
    _require_mapping(located, "inventory")
    # Ranges, groups and patterns become plain devices and fibres first: the models and checks never see them.
    expanded = expand_inventory(located)
    _raise(located, expanded.problems)
    located = located.expanded(expanded.data, expanded.origins)
    inv = validate(Inventory, located)
    _raise(located, check_inventory(inv, located.describe))
    return Loaded(inv, located, expanded.shorthands)


def load_playbook(path: str | Path, inventory: Inventory | None = None) -> Loaded:
    located = load_yaml(path)
    _require_mapping(located, "playbook")
    try:
        pb = validate(Playbook, located)
    except ConfigError as exc:
        raise ConfigError(_steps_without_action(located, exc.problems)) from None
    _raise(located, check_playbook(pb, inventory))
    return Loaded(pb, located)


def _steps_without_action(located: LocatedData, problems: list[ConfigProblem]) -> list[ConfigProblem]:
    """The problems, with pydantic's "Unable to extract tag using discriminator 'action'" (a step without an
    `action` key: most often a misspelled one) said for people: the key it has in its place, and the step kinds.
    """
    from testbed.steps import STEP_KINDS

    kinds = ", ".join(STEP_KINDS.names())
    fields = {name for kind in STEP_KINDS for name in kind.model_fields}  # a key some step has is no misspelling
    found = {}
    for loc, step in _steps(located.data):
        if isinstance(step, dict) and "action" not in step:
            keys = [str(k) for k in step]
            close = difflib.get_close_matches("action", [k for k in keys if k not in fields], n=1, cutoff=0.7)
            if close:
                said = f"`{close[0]}` is not a key of a step (did you mean `action`?)"
            else:
                said = f"a step needs an `action` key (this one has {', '.join(keys) or 'none'})"
            found[format_loc((*loc, "action"))] = located.problem(
                (*loc, close[0]) if close else loc, f"{said}; a step's `action` is one of the step kinds: {kinds}"
            )
    out = []
    for problem in problems:
        if problem.message.startswith("Unable to extract tag using discriminator") and problem.key in found:
            out.append(found[problem.key])
        else:
            out.append(problem)
    return out


def _steps(data: dict, sections: tuple[str, ...] = ("setup", "steps", "teardown"), loc: tuple = ()):
    """(key path, step) of every step written in the playbook's sections, those nested in `parallel` too."""
    for section in sections:
        steps = data.get(section) if isinstance(data, dict) else None
        if not isinstance(steps, list):
            continue
        for i, step in enumerate(steps):
            yield (*loc, section, i), step
            if isinstance(step, dict) and step.get("action") == "parallel":
                yield from _steps(step, ("steps",), (*loc, section, i))


def declared_inventory(playbook: str | Path) -> str | None:
    """The inventory a playbook names (`inventory:`, relative to its file), None if it names none. Read before
    the playbook is validated (that needs the inventory): a file that does not exist is reported at its key.
    """
    located = load_yaml(playbook)
    name = located.data.get("inventory") if isinstance(located.data, dict) else None
    if not isinstance(name, str):
        return None  # absent, or not a string: validating the playbook says so at its line
    path = Path(playbook).parent / name
    if not path.is_file():
        _raise(located, [(("inventory",), f"no such file: {path} (the path is relative to the playbook)")])
    return str(path)


def detect_kind(path: str | Path) -> str:
    """'inventory' or 'playbook', from the file's top-level keys."""
    located = load_yaml(path)
    _require_mapping(located, "inventory or playbook")
    if "devices" in located.data:
        return "inventory"
    if "steps" in located.data:
        return "playbook"
    raise ConfigError(
        [
            ConfigProblem(
                located.file, 1, "", "neither an inventory (it has no `devices`) nor a playbook (it has no `steps`)"
            )
        ]
    )


def _require_mapping(located: LocatedData, what: str) -> None:
    if not isinstance(located.data, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    located.file, 1, "", f"expected a mapping of keys (an {what}), got {type(located.data).__name__}"
                )
            ]
        )


def _raise(located: LocatedData, problems) -> None:
    if problems:
        raise ConfigError(located.problems(problems))
