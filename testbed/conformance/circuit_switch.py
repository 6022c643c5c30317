"""Conformance checks for a CircuitSwitch driver (drivers.capabilities.CircuitSwitch).

Run them against a driver connected to a switch whose ports may be changed freely: an emulator, or a
lab switch that is not in use. Every check leaves the switch without circuits and with its ports enabled.

What a driver must do to pass, beyond returning the right values:
- report every problem of the device as a typed drivers.errors.DeviceError subclass naming the device
  (DeviceCommandError when the switch refuses a command), never a raw ValueError, KeyError or IndexError;
- leave itself usable after an error: the next call is judged alone, not blamed for an earlier refusal;
- with check=False, not raise for a refused command but report it on the next check_errors().
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from drivers.capabilities import CircuitSwitch
from drivers.errors import DeviceError

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
PORT_STATES = frozenset("EDF")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: status is "passed", "failed" or "skipped"; detail says why."""

    check: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status != FAILED

    def __str__(self) -> str:
        return f"{self.status.upper():7} {self.check}" + (f": {self.detail}" if self.detail else "")


class CheckFailed(AssertionError):
    """Raised inside a check: the driver does not conform; the message says how."""


class CheckSkipped(Exception):
    """Raised inside a check that cannot run with the given parameters."""


@dataclass(frozen=True)
class SwitchUnderTest:
    """A driver and what the check needs to know about the switch behind it."""

    driver: CircuitSwitch  # as the checks call it; check_capability judges whether it has every method
    inputs: int  # ingress ports 1..inputs
    outputs: int  # egress ports inputs+1..inputs+outputs
    lit_ingress: tuple[int, ...]  # ingress ports with light arriving (for the optical checks)
    min_power_dbm: float

    @property
    def first_egress(self) -> int:
        return self.inputs + 1

    @property
    def beyond(self) -> int:
        """The first port number the switch does not have."""
        return self.inputs + self.outputs + 1

    def pair(self, k: int = 0) -> tuple[int, int]:
        """The k-th test circuit: lit ingress ports first, then the others; egress ports in order."""
        order = list(dict.fromkeys([*self.lit_ingress, *range(1, self.inputs + 1)]))
        if k >= len(order) or k >= self.outputs:
            raise CheckSkipped(f"the switch is too small for {k + 1} test circuits")
        return order[k], self.first_egress + k

    def empty(self) -> None:
        self.driver.disconnect_all()
        self.driver.wait_settled()


Check = Callable[[SwitchUnderTest], str | None]
CHECKS: dict[str, Check] = {}


def _check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn

    return register


def _expect_device_error(what: str, call: Callable[[], object]) -> DeviceError:
    try:
        call()
    except DeviceError as err:
        if err.device in (None, "", "?"):
            raise CheckFailed(
                f"{what} raised {type(err).__name__} without naming the device (device={err.device!r}); "
                "pass device= (and address=, sent=, received=) so the user knows where to look"
            ) from err
        return err
    except Exception as exc:
        raise CheckFailed(
            f"{what} raised {_qualname(exc)} ({exc}), which is not a drivers.errors.DeviceError subclass; a "
            "driver must report what the device refused as a typed DeviceError (DeviceCommandError for a "
            "refused command, DeviceProtocolError for an unexpected reply)"
        ) from exc
    raise CheckFailed(f"{what} returned without an error; a port the switch does not have must raise a DeviceError")


def _equal(what: str, got: object, want: object) -> None:
    if got != want:
        raise CheckFailed(f"{what}: expected {want!r}, got {got!r}")


def _qualname(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


# -- the checks, in the order they run -------------------------------------------------------------


@_check("capability")
def check_capability(s: SwitchUnderTest) -> str | None:
    missing = [name for name in _protocol_members(CircuitSwitch) if not callable(getattr(s.driver, name, None))]
    if missing:
        raise CheckFailed(f"the driver lacks CircuitSwitch method(s) {', '.join(missing)}")
    return None


@_check("identify")
def check_identify(s: SwitchUnderTest) -> str | None:
    ident = s.driver.identify()
    fields = {f: getattr(ident, f, None) for f in ("vendor", "model", "serial", "firmware")}
    for name, value in fields.items():
        if not isinstance(value, str) or not value or value != value.strip():
            raise CheckFailed(
                f"identify().{name} is {value!r}; expected a non-empty string without surrounding whitespace "
                "(a stray '\\r' usually means the read termination is wrong)"
            )
    return ", ".join(str(value) for value in fields.values())  # each checked to be a str above


@_check("size")
def check_size(s: SwitchUnderTest) -> str | None:
    got = s.driver.size()
    _equal("size()", tuple(got) if isinstance(got, tuple | list) else got, (s.inputs, s.outputs))
    if not all(type(v) is int for v in got):
        raise CheckFailed(f"size() must return ints, got {got!r}")
    return None


@_check("disconnect_all")
def check_disconnect_all(s: SwitchUnderTest) -> str | None:
    i, e = s.pair(0)
    s.driver.connect([(i, e)])
    s.empty()
    _equal("connections() after disconnect_all()", s.driver.connections(), {})
    return None


@_check("connect")
def check_connect(s: SwitchUnderTest) -> str | None:
    s.empty()
    pairs = dict([s.pair(0), s.pair(1)])
    s.driver.connect(list(pairs.items()))
    s.driver.wait_settled()
    got = s.driver.connections()
    _equal("connections() after connect()", got, pairs)
    if not all(type(k) is int and type(v) is int for k, v in got.items()):
        raise CheckFailed(f"connections() must map int ingress -> int egress, got {got!r}")
    s.empty()
    return None


@_check("disconnect")
def check_disconnect(s: SwitchUnderTest) -> str | None:
    s.empty()
    a, b = s.pair(0), s.pair(1)
    s.driver.connect([a, b])
    s.driver.disconnect([a])
    s.driver.wait_settled()
    _equal(f"connections() after disconnect([{a}])", s.driver.connections(), dict([b]))
    s.empty()
    return None


@_check("light")
def check_light(s: SwitchUnderTest) -> str | None:
    if not s.lit_ingress:
        raise CheckSkipped("no lit_ingress given: which ingress ports have light arriving is unknown")
    s.empty()
    i, e = s.pair(0)
    dark_egress = s.first_egress + 1
    s.driver.connect([(i, e)])
    s.driver.wait_settled()
    powers = s.driver.port_power([e, dark_egress])
    _equal("the ports port_power() answered for", sorted(powers), sorted([e, dark_egress]))
    if not all(isinstance(v, float) for v in powers.values()):
        raise CheckFailed(f"port_power() must return floats (dBm), got {powers!r}")
    if powers[e] <= s.min_power_dbm:
        raise CheckFailed(
            f"egress {e} reads {powers[e]} dBm after connect([({i}, {e})]) and wait_settled(); expected light "
            f"above {s.min_power_dbm} dBm from lit ingress {i} (does wait_settled return before the move ends?)"
        )
    if powers[dark_egress] > s.min_power_dbm:
        raise CheckFailed(f"egress {dark_egress} has no circuit but reads {powers[dark_egress]} dBm")
    s.empty()
    return f"egress {e}: {powers[e]} dBm"


@_check("port_states")
def check_port_states(s: SwitchUnderTest) -> str | None:
    i, e = s.pair(0)
    states = dict(s.driver.port_states([i, e]))
    if sorted(states) != sorted([i, e]) or not set(states.values()) <= PORT_STATES:
        raise CheckFailed(f"port_states([{i}, {e}]) must map each port to 'E', 'D' or 'F', got {states!r}")
    try:
        s.driver.set_port_enabled([e], False)
        _equal(f"port_states([{e}]) after set_port_enabled([{e}], False)", dict(s.driver.port_states([e])), {e: "D"})
    finally:
        s.driver.set_port_enabled([e], True)
    _equal(f"port_states([{e}]) after set_port_enabled([{e}], True)", dict(s.driver.port_states([e])), {e: "E"})
    return None


@_check("check_errors")
def check_check_errors(s: SwitchUnderTest) -> str | None:
    s.empty()
    s.driver.connect([s.pair(0)], check=False)
    s.driver.wait_settled()
    s.driver.check_errors()  # nothing was refused: must not raise
    s.empty()
    return None


@_check("out_of_range_connect")
def check_out_of_range_connect(s: SwitchUnderTest) -> str | None:
    s.empty()
    i, _ = s.pair(0)
    err = _expect_device_error(f"connect([({i}, {s.beyond})])", lambda: s.driver.connect([(i, s.beyond)]))
    # The refusal changed nothing, and the next command is judged on its own.
    _equal("connections() after a refused connect", s.driver.connections(), {})
    s.driver.connect([s.pair(0)])
    s.driver.wait_settled()
    _equal("connections() after a good connect that follows a refused one", s.driver.connections(), dict([s.pair(0)]))
    s.empty()
    return type(err).__name__


@_check("out_of_range_deferred")
def check_out_of_range_deferred(s: SwitchUnderTest) -> str | None:
    s.empty()
    i, _ = s.pair(0)
    what = f"connect([({i}, {s.beyond})], check=False)"
    try:
        s.driver.connect([(i, s.beyond)], check=False)
    except DeviceError as refused:
        return f"refused at once ({type(refused).__name__})"  # allowed: the driver validated before sending
    except Exception as exc:
        raise CheckFailed(f"{what} raised {_qualname(exc)} ({exc}), not a drivers.errors.DeviceError") from exc
    deferred = _expect_device_error(f"check_errors() after {what}", s.driver.check_errors)
    s.driver.check_errors()  # the queue was drained: a second look finds nothing
    return type(deferred).__name__


@_check("out_of_range_port_power")
def check_out_of_range_port_power(s: SwitchUnderTest) -> str | None:
    err = _expect_device_error(f"port_power([{s.beyond}])", lambda: s.driver.port_power([s.beyond]))
    _equal("connections() after the refused query", s.driver.connections(), {})
    return type(err).__name__


@_check("out_of_range_port_states")
def check_out_of_range_port_states(s: SwitchUnderTest) -> str | None:
    err = _expect_device_error(f"port_states([{s.beyond}])", lambda: s.driver.port_states([s.beyond]))
    _equal("connections() after the refused query", s.driver.connections(), {})
    return type(err).__name__


def _protocol_members(proto: type) -> list[str]:
    return sorted(name for name in vars(proto) if not name.startswith("_") and callable(getattr(proto, name, None)))


# -- running them ----------------------------------------------------------------------------------


def switch_under_test(
    driver: object, *, size: int | tuple[int, int], lit_ingress: Iterable[int] = (), min_power_dbm: float = -20.0
) -> SwitchUnderTest:
    inputs, outputs = (size, size) if isinstance(size, int) else tuple(size)
    # Any object is accepted: whether it is a CircuitSwitch is what the checks find out (check_capability first).
    return SwitchUnderTest(cast(CircuitSwitch, driver), inputs, outputs, tuple(lit_ingress), min_power_dbm)


def run_check(name: str, switch: SwitchUnderTest) -> CheckResult:
    """One check; never raises for what the driver does (that is the result)."""
    try:
        detail = CHECKS[name](switch)
    except CheckSkipped as skip:
        return CheckResult(name, SKIPPED, str(skip))
    except CheckFailed as failed:
        return CheckResult(name, FAILED, str(failed))
    except DeviceError as err:
        return CheckResult(name, FAILED, f"raised {type(err).__name__} where the call should succeed:\n{err}")
    except Exception as exc:
        return CheckResult(
            name,
            FAILED,
            f"raised {_qualname(exc)} ({exc}); a driver must raise drivers.errors.DeviceError subclasses only",
        )
    return CheckResult(name, PASSED, detail or "")


def check_circuit_switch(
    driver: object,
    *,
    size: int | tuple[int, int],
    lit_ingress: Iterable[int] = (),
    min_power_dbm: float = -20.0,
    checks: Iterable[str] | None = None,
) -> list[CheckResult]:
    """Run the circuit-switch checks (all, or the named ones) against `driver`; one result per check.

    size: N for an NxN switch, or (inputs, outputs). lit_ingress: ingress ports with light arriving
    (the optical check is skipped without one). Ports used: the first two ingress ports (lit ones
    first) and the first two egress ports.
    """
    switch = switch_under_test(driver, size=size, lit_ingress=lit_ingress, min_power_dbm=min_power_dbm)
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; checks: {', '.join(CHECKS)}")
    return [run_check(name, switch) for name in names]
