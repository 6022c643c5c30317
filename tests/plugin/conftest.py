"""The plugin tests run small user test suites in pytester, with the plugin loaded as a user would."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

import drivers.transports.visa  # noqa: F401
import emulators.twin  # noqa: F401
import testbed.conformance  # noqa: F401
import testbed.engine.run  # noqa: F401

# pytester runs the user suites in this process and afterwards forgets the modules they imported; numpy
# cannot be imported twice in one process, so what the plugin loads is imported once, here, and kept.
import testbed.families.drivers  # noqa: F401
import testbed.twin.bridge  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
RACK = REPO / "playbooks" / "inventory" / "emulated-rack.yaml"

SMALL_INVENTORY = """\
name: small
devices:
  sw:
    kind: ocs
    driver: polatis-scpi
    transport: {type: visa, resource: "TCPIP0::192.0.2.20::5025::SOCKET", timeout_ms: 500}
    size: 8
"""


def pytest_configure(config: pytest.Config) -> None:
    # pytester, registered here rather than with `pytest_plugins = ["pytester"]`: pytest refuses
    # `pytest_plugins` in a conftest below the rootdir when the whole suite is collected.
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


def plugin_args() -> list[str]:
    """`-p testbed.twin.pytest_plugin` until the `pytest11` entry point is installed; then pytest loads it itself
    (and loading it both ways would register the same module twice).
    """
    installed = any(ep.value.startswith("testbed.twin.pytest_plugin") for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "testbed.twin.pytest_plugin"]


@pytest.fixture
def run_user_tests(pytester: pytest.Pytester):
    """Run the user test files written into pytester's folder, with the plugin and `args`."""

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider", "-p", "no:timeout", *args)

    return run
