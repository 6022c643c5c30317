"""Independent peers (implementations we did not write) that a test needs: skipped where one is missing,
a failure where the run requires them (CI sets TESTBED_REQUIRE_PEERS=1 and installs every peer, docs/interop.md).
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest

REQUIRED = os.environ.get("TESTBED_REQUIRE_PEERS") == "1"


def unavailable(message: str) -> None:
    """A peer that cannot be had or run here: skip, or fail under TESTBED_REQUIRE_PEERS=1."""
    if REQUIRED:
        pytest.fail(f"{message} (TESTBED_REQUIRE_PEERS=1: every peer must be installed and run; .ci/run installs them)")
    pytest.skip(message)


def _missing(what: str, why: str) -> None:
    unavailable(f"{what} is not installed: {why}")


def require_peer(module: str, why: str) -> ModuleType:
    """Import a peer's Python module, or skip (fail under TESTBED_REQUIRE_PEERS=1) naming what is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        _missing(module, why)
        raise  # unreachable: skip and fail raise


def require_program(program: str, why: str) -> str:
    """The path of a peer's program on PATH, or skip (fail under TESTBED_REQUIRE_PEERS=1)."""
    path = shutil.which(program)
    if path is None:
        _missing(program, why)
    return path


def environment_without(module: str, folder) -> dict[str, str]:
    """This process's environment for a child Python that cannot import `module`, as if it were not installed: a
    sitecustomize module in `folder` (a new folder), first on the path, marks it absent; nothing of the project is
    replaced.
    """
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"import sys\n\nsys.modules[{module!r}] = None  # import {module} fails\n")
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}
