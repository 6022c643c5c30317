"""Loading and validating inventories and playbooks: the only place where files become models.

The names below are loaded on first use (testbed/config/load.py): the device families' models build on
testbed.config.device and testbed.config.common, and importing those must not build the inventory's
union of every family before the families themselves are registered."""

from __future__ import annotations

import importlib

__all__ = ["Inventory", "Loaded", "Playbook", "declared_inventory", "detect_kind", "load_inventory", "load_playbook"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("testbed.config.load"), name)
    raise AttributeError(f"module 'testbed.config' has no attribute {name!r}")
