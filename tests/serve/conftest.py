"""The folder the servers of these tests make their sockets in."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts import shared_folder


@pytest.fixture(scope="module")
def serve_dir() -> Iterator[Path]:
    """The folder of the servers' sockets: in a folder every account may reach, as /run/testbed is."""
    base = shared_folder()
    yield base / "serve"
    shutil.rmtree(base, ignore_errors=True)
