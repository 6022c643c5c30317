"""Registries: the framework's open seams (device families, step kinds, fault kinds, transports).

Each is a name -> definition table. The framework registers its own definitions on import; another package
adds its own through an entry point of the registry's group, in its pyproject.toml:

    [project.entry-points."testbed.families"]
    voa = "mylab.voa:FAMILY"

An entry point names a definition, a list of them, or a function returning either. Entry points are loaded
the first time the registry is read. A built-in name always wins: an installed package cannot silently
replace what the project ships and tests (the clash is logged).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, EntryPoints
from typing import Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def entry_points(group: str) -> EntryPoints:
    """The installed entry points of `group`. importlib reads every installed package's metadata at each call, and a
    command reads half a dozen registries (more in each hub's process): the packages are read once a process.
    """
    found: EntryPoints = _installed_entry_points().select(group=group)
    return found


@functools.cache
def _installed_entry_points() -> Any:  # EntryPoints from Python 3.12, SelectableGroups in 3.11: both select(group=)
    return importlib.metadata.entry_points()


class RegistryError(LookupError):
    """A name the registry does not know, or two definitions under one name."""


class Registry(Generic[T]):
    """A name -> definition table: the built-ins registered on import, other packages' from their entry points."""

    def __init__(
        self,
        what: str,
        group: str,
        name_of: Callable[[T], str],
        from_entry_point: Callable[[EntryPoint, object], T | list[T]] | None = None,
    ) -> None:
        self.what = what  # "device family", for messages
        self.group = group  # the entry-point group
        self._name_of = name_of
        self._from_entry_point = from_entry_point  # turns what an entry point loads into definitions
        self._items: dict[str, T] = {}
        self._builtin: set[str] = set()
        self._loaded = False
        self._lock = threading.RLock()

    def register(self, item: T, *, builtin: bool = False) -> T:
        """Add `item` under its name and return it; a built-in's name is never taken by another package's."""
        name = self._name_of(item)
        with self._lock:
            if name in self._items and (name in self._builtin or not builtin):
                if name in self._builtin:
                    log.warning("ignoring %s %r from another package: it is built in", self.what, name)
                    return self._items[name]
                raise RegistryError(f"two {self.what}s are named {name!r}")
            self._items[name] = item
            if builtin:
                self._builtin.add(name)
        return item

    def _load_entry_points(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # first: a plugin that reads the registry while it loads sees the built-ins
            for ep in entry_points(group=self.group):
                if ep.name in self._builtin:  # not even loaded: it could only lose to the built-in
                    log.warning("ignoring entry point %s = %s: %r is built in", ep.name, ep.value, ep.name)
                    continue
                loaded = ep.load()
                if self._from_entry_point is not None:
                    items = self._from_entry_point(ep, loaded)
                else:
                    items = loaded() if callable(loaded) and not _is_definition(loaded) else loaded
                for item in items if isinstance(items, list | tuple) else (items,):
                    self.register(item)

    def get(self, name: str) -> T:
        """The definition named `name`; a RegistryError naming the known ones if there is none."""
        self._load_entry_points()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise RegistryError(
                f"no {self.what} named {name!r} (known: {known}; another package adds one under the "
                f"{self.group!r} entry-point group)"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._items

    def names(self) -> list[str]:
        """Every registered name, in the order registered (the built-ins first)."""
        self._load_entry_points()
        return list(self._items)

    def __iter__(self) -> Iterator[T]:
        self._load_entry_points()
        return iter(list(self._items.values()))


def _is_definition(obj: object) -> bool:
    """A definition object (a dataclass instance, a class) rather than a factory function."""
    return not (callable(obj) and type(obj).__name__ in ("function", "builtin_function_or_method"))
