"""Conformance suites for third-party drivers and their emulators.

Without pytest:

    from testbed.conformance import check_circuit_switch
    for result in check_circuit_switch(driver, size=16, lit_ingress=[1]):
        print(result)

In a plugin's test suite (one pytest test per check, in the manner of NAPALM's shared getter tests):

    from testbed.conformance import circuit_switch_suite

    @pytest.fixture
    def switch():                       # your driver, connected to your emulator
        ...
        yield driver

    test_switch_conformance = circuit_switch_suite("switch", size=16, lit_ingress=[1])

`circuit_switch_suite` takes the name of a fixture that gives the driver (parametrize that fixture to
cover several transports), a factory function returning a fresh driver, or a mapping of names to
factories (each becomes a parameter). Docs: docs/ecosystem.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from testbed.conformance.circuit_switch import (
    CHECKS as CIRCUIT_SWITCH_CHECKS,
)
from testbed.conformance.circuit_switch import (
    FAILED,
    PASSED,
    SKIPPED,
    CheckResult,
    check_circuit_switch,
    run_check,
    switch_under_test,
)

__all__ = [
    "CIRCUIT_SWITCH_CHECKS",
    "CheckResult",
    "FAILED",
    "PASSED",
    "SKIPPED",
    "check_circuit_switch",
    "circuit_switch_suite",
]

DriverSource = str | Callable[[], Any] | Mapping[str, Callable[[], Any]]


def circuit_switch_suite(
    driver: DriverSource,
    *,
    size: int | tuple[int, int],
    lit_ingress: Iterable[int] = (),
    min_power_dbm: float = -20.0,
    checks: Iterable[str] | None = None,
) -> Callable[..., None]:
    """A pytest test function, parametrized with one test per check; assign it to a `test_*` name.

    driver: a fixture name (str), a factory returning a fresh driver, or {name: factory}. Drivers made
    by a factory are closed after each check; a fixture's driver is the fixture's to close.
    """
    import pytest

    names = list(CIRCUIT_SWITCH_CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CIRCUIT_SWITCH_CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; checks: {', '.join(CIRCUIT_SWITCH_CHECKS)}")
    lit = tuple(lit_ingress)
    factories: dict[str, str | Callable[[], Any]]
    if isinstance(driver, Mapping):
        factories = dict(driver)
    elif isinstance(driver, str) or callable(driver):
        factories = {"driver": driver}
    else:
        raise TypeError(f"driver must be a fixture name, a factory or a mapping of factories, got {driver!r}")

    def run(request, key: str, check: str) -> None:
        source = factories[key]
        if isinstance(source, str):
            instance, made = request.getfixturevalue(source), None
        else:
            instance = made = source()
        try:
            switch = switch_under_test(instance, size=size, lit_ingress=lit, min_power_dbm=min_power_dbm)
            result = run_check(check, switch)
        finally:
            close = getattr(made, "close", None)
            if close is not None:
                close()
        if result.status == SKIPPED:
            pytest.skip(result.detail)
        if result.status == FAILED:
            where = f" on {key!r}" if len(factories) > 1 else ""
            pytest.fail(f"circuit-switch conformance, check {check!r}{where}:\n{result.detail}", pytrace=False)

    if len(factories) == 1:
        (only,) = factories

        @pytest.mark.parametrize("conformance_check", names)
        def test_circuit_switch_conformance(request, conformance_check: str) -> None:
            run(request, only, conformance_check)

        return test_circuit_switch_conformance

    @pytest.mark.parametrize("conformance_check", names)
    @pytest.mark.parametrize("conformance_driver", list(factories))
    def test_circuit_switch_conformance_each(request, conformance_driver: str, conformance_check: str) -> None:
        run(request, conformance_driver, conformance_check)

    return test_circuit_switch_conformance_each
