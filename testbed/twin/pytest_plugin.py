"""pytest plugin: test your own playbooks and drivers against the emulated twin of an inventory.

Registered under the `pytest11` entry-point group as `testbed` (or load it by hand with
`-p testbed.twin.pytest_plugin`). It only adds options, a marker and fixtures; nothing is imported or
started until a test asks for a `testbed_*` fixture, so installing testbed costs other test suites nothing.

Fixtures
    testbed_inventory  the validated Inventory model (testbed.documents.inventory.Inventory)
    testbed_twin       a running emulators.twin.TwinProcess for it: `.endpoints`, `.control`
    testbed_lab        the inventory pointed at the twin's endpoints, asserted loopback-only
    testbed_driver     a factory: `testbed_driver("ocs1")` -> the inventory's real driver (testbed.families.drivers
                       .make_driver) on the twin's endpoint, the device reset to its initial state, closed at
                       teardown; every byte exchanged is in `testbed_driver.audit` (AuditRecords)

Which inventory (first that applies)
    @pytest.mark.testbed_inventory("path") on a module (`pytestmark = ...`), relative to the rootdir;
    --testbed-inventory PATH, relative to the directory pytest was started in;
    the `testbed_inventory` ini option, relative to the ini file;
    playbooks/inventory/emulated-rack.yaml, relative to the rootdir.

One twin per inventory is booted on first use and kept for the whole session (it boots in well under a
second, but a session does not need a dozen of them); the fixtures handing it out are module-scoped so
the marker can pick the inventory per module. Tests share the twin: `testbed_driver` resets each device
it hands out (reset=False to keep the state), other state (`testbed_twin.control`) is yours to reset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEFAULT_INVENTORY = "playbooks/inventory/emulated-rack.yaml"
MARKER = "testbed_inventory"
_AUDIT_SECTION_LIMIT = 200  # records shown under a failing test's report


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("testbed", "testbed: the emulated twin of a lab inventory")
    group.addoption(
        "--testbed-inventory",
        dest="testbed_inventory",
        default=None,
        metavar="PATH",
        help=f"inventory whose twin the testbed_* fixtures boot (default: the ini option, else {DEFAULT_INVENTORY})",
    )
    group.addoption(
        "--testbed-seed",
        dest="testbed_seed",
        type=int,
        default=0,
        help="seed of the emulators' random draws (switching jitter, noise); default 0",
    )
    parser.addini(
        "testbed_inventory",
        help=f"inventory for the testbed_* fixtures, relative to the ini file (default {DEFAULT_INVENTORY})",
        default=None,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(path): the inventory whose emulated twin this module's testbed_* fixtures use "
        "(relative to the rootdir); set it on the module: pytestmark = pytest.mark.testbed_inventory(...)",
    )


# -- the twins of a session ------------------------------------------------------------------------


@dataclass
class _Booted:
    path: Path
    inventory: Any  # testbed.documents.inventory.Inventory
    twin: Any = None  # emulators.twin.TwinProcess
    lab: Any = None  # the inventory pointed at the twin


class TestbedTwins:
    """Every twin of the session, by inventory file; booted on first use, stopped at the end."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._booted: dict[Path, _Booted] = {}

    def _entry(self, path: Path) -> _Booted:
        path = path.resolve()
        entry = self._booted.get(path)
        if entry is None:
            if not path.is_file():
                pytest.fail(
                    f"testbed: inventory {path} not found; give one with --testbed-inventory PATH, the "
                    f"`testbed_inventory` ini option or @pytest.mark.{MARKER}(PATH)",
                    pytrace=False,
                )
            from testbed.contracts.errors import UserError
            from testbed.documents import load_inventory

            try:
                inventory = load_inventory(path).model
            except UserError as exc:  # ConfigError: every problem with file:line
                pytest.fail(f"testbed: invalid inventory {path}:\n{exc}", pytrace=False)
            entry = self._booted[path] = _Booted(path, inventory)
        return entry

    def inventory(self, path: Path) -> Any:
        return self._entry(path).inventory

    def twin(self, path: Path) -> Any:
        entry = self._entry(path)
        if entry.twin is None:
            from emulators.twin import TwinProcess
            from testbed.twin.bridge import twin_spec

            spec = twin_spec(entry.inventory, self.seed)
            if not spec.devices:
                pytest.fail(f"testbed: {path} has no device the twin can emulate", pytrace=False)
            twin = TwinProcess(spec)
            twin.start()  # raises TwinStartError with the twin's stderr
            entry.twin = twin
        return entry.twin

    def lab(self, path: Path) -> Any:
        entry = self._entry(path)
        if entry.lab is None:
            from testbed.twin.bridge import assert_loopback, point_at_twin

            twin = self.twin(path)
            lab = point_at_twin(entry.inventory, twin.endpoints.to_json())
            assert_loopback(lab, list(twin.endpoints.devices))  # never hand out a real address
            entry.lab = lab
        return entry.lab

    def close(self) -> None:
        for entry in self._booted.values():
            if entry.twin is not None:
                entry.twin.stop()
                entry.twin = entry.lab = None


def resolve_inventory(config: pytest.Config, marker: pytest.Mark | None) -> Path:
    """The inventory file for a module, by the rules in the module docstring."""
    if marker is not None:
        if len(marker.args) != 1 or not isinstance(marker.args[0], str | Path):
            raise pytest.UsageError(f"@pytest.mark.{MARKER} takes one path, got {marker.args!r}")
        return _under(config.rootpath, marker.args[0])
    option = config.getoption("testbed_inventory", None)
    if option:
        return _under(config.invocation_params.dir, option)
    ini = config.getini("testbed_inventory")
    if ini:
        base = config.inipath.parent if config.inipath is not None else config.rootpath
        return _under(base, ini)
    return _under(config.rootpath, DEFAULT_INVENTORY)


def _under(base: Path, path: str | Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def testbed_twins(pytestconfig: pytest.Config):
    """All twins of the session (one per inventory file), stopped when the session ends."""
    twins = TestbedTwins(seed=pytestconfig.getoption("testbed_seed", 0) or 0)
    yield twins
    twins.close()


@pytest.fixture(scope="module")
def testbed_inventory_path(request: pytest.FixtureRequest) -> Path:
    """The inventory file this module uses."""
    return resolve_inventory(request.config, request.node.get_closest_marker(MARKER))


@pytest.fixture(scope="module")
def testbed_inventory(testbed_twins: TestbedTwins, testbed_inventory_path: Path):
    """The loaded, validated inventory (testbed.documents.inventory.Inventory)."""
    return testbed_twins.inventory(testbed_inventory_path)


@pytest.fixture(scope="module")
def testbed_twin(testbed_twins: TestbedTwins, testbed_inventory_path: Path):
    """The running twin (emulators.twin.TwinProcess): `.endpoints.devices[name]`, `.control.call(...)`."""
    return testbed_twins.twin(testbed_inventory_path)


@pytest.fixture(scope="module")
def testbed_lab(testbed_twins: TestbedTwins, testbed_inventory_path: Path):
    """The inventory with every emulated device's transport replaced by its twin endpoint (loopback only)."""
    return testbed_twins.lab(testbed_inventory_path)


@dataclass
class TwinDrivers:
    """`testbed_driver`: builds the inventory's real drivers on the twin's endpoints and closes them."""

    lab: Any
    twin: Any
    audit: list = field(default_factory=list)  # drivers.audit.AuditRecord, every byte, in order
    _drivers: list = field(default_factory=list)
    _reset: set = field(default_factory=set)

    def __call__(self, device: str, *, reset: bool = True) -> Any:
        from testbed.families.drivers import make_driver

        devices = self.lab.devices
        if device not in devices:
            pytest.fail(f"testbed_driver: no device {device!r} in the inventory (devices: {', '.join(devices)})")
        if device not in self.twin.endpoints.devices:
            pytest.fail(f"testbed_driver: {device!r} is a {devices[device].kind}, which has no emulator yet")
        if reset and device not in self._reset:
            self.twin.control.call(device, "reset")  # back to the state the inventory describes
            self._reset.add(device)
        settings = devices[device].transport.settings()
        driver = make_driver(devices[device].driver, device, settings, self.audit.append)
        self._drivers.append(driver)
        return driver

    def records(self, device: str | None = None, direction: str | None = None) -> list:
        """The audit records, optionally of one device and one direction ("tx" or "rx")."""
        return [
            r
            for r in self.audit
            if (device is None or r.device == device) and (direction is None or r.direction == direction)
        ]

    def transcript(self, limit: int = _AUDIT_SECTION_LIMIT) -> str:
        shown = self.audit[-limit:]
        lines = [f"{r.device} {r.direction} {r.data!r}" for r in shown]
        if len(self.audit) > len(shown):
            lines.insert(0, f"... {len(self.audit) - len(shown)} earlier records")
        return "\n".join(lines)

    def close(self) -> None:
        while self._drivers:
            driver = self._drivers.pop()
            close = getattr(driver, "close", None)
            if close is not None:
                close()


@pytest.fixture
def testbed_driver(request: pytest.FixtureRequest, testbed_lab, testbed_twin):
    """`testbed_driver("ocs1")` -> the device's driver on the twin, reset; closed at teardown."""
    _refuse_misplaced_marker(request)
    drivers = TwinDrivers(testbed_lab, testbed_twin)
    yield drivers
    drivers.close()


def _refuse_misplaced_marker(request: pytest.FixtureRequest) -> None:
    # The twin fixtures are module-scoped: a marker on a class or a test would be silently ignored.
    mine = request.node.get_closest_marker(MARKER)
    module = request.node.getparent(pytest.Module)
    theirs = module.get_closest_marker(MARKER) if module is not None else None
    if mine is not None and (theirs is None or mine.args != theirs.args):
        pytest.fail(
            f"@pytest.mark.{MARKER} applies per module: set `pytestmark = pytest.mark.{MARKER}(...)` at the "
            "top of the module instead of marking a class or a test",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    drivers = getattr(item, "funcargs", {}).get("testbed_driver")
    if report.failed and isinstance(drivers, TwinDrivers) and drivers.audit:
        report.sections.append(("testbed audit (last exchanges with the twin)", drivers.transcript()))
    return report
