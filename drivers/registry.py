"""Driver names used in inventories -> factories that build the driver for one device.

A factory takes (device, settings, audit) and returns a driver object implementing a capability from
testbed.capabilities. It opens its own transport, so a family that is not line-oriented (SSH hosts)
fits the same table. Nothing is connected yet when a driver is made: transports connect on first use.

Third-party drivers register a factory under the `testbed.drivers` entry-point group, e.g. in their
pyproject.toml:

    [project.entry-points."testbed.drivers"]
    calient-tl1 = "mylab.calient:make_calient"
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .audit import AuditSink
from .polatis import PolatisScpi
from .transports import TransportSettings, open_transport

ENTRY_POINT_GROUP = "testbed.drivers"

DriverFactory = Callable[[str, TransportSettings, AuditSink | None], Any]

log = logging.getLogger(__name__)


def _polatis_scpi(device: str, settings: TransportSettings, audit: AuditSink | None) -> PolatisScpi:
    return PolatisScpi(open_transport(settings, device, audit), device)


def _ssh_gpu_host(device: str, settings: Any, audit: AuditSink | None) -> Any:
    # settings: drivers.ssh.SshSettings. Imported here: paramiko loads only for labs with SSH hosts.
    from .gpuhost import GpuHostSsh
    from .ssh import SshTransport

    return GpuHostSsh(SshTransport(settings, device, audit), device)


def _qontrol_mesh(device: str, settings: TransportSettings, audit: AuditSink | None):
    from .mesh import QontrolMesh

    return QontrolMesh(open_transport(settings, device, audit), device)


def _scpi_mesh(device: str, settings: TransportSettings, audit: AuditSink | None):
    from .mesh import ScpiMesh

    return ScpiMesh(open_transport(settings, device, audit), device)


# Built-in drivers. They win over an entry point of the same name, so an installed package cannot
# silently replace a driver the project ships and tests.
DRIVERS: dict[str, DriverFactory] = {
    "polatis-scpi": _polatis_scpi,
    "qontrol-mesh": _qontrol_mesh,
    "scpi-mesh": _scpi_mesh,
    "ssh": _ssh_gpu_host,
}


def available_drivers() -> dict[str, DriverFactory | Any]:
    """Built-in drivers plus the (not yet loaded) entry points of installed third-party packages."""
    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in DRIVERS:
            log.warning("ignoring entry point %s=%s: %r is a built-in driver", ep.name, ep.value, ep.name)
            continue
        found[ep.name] = ep
    return {**found, **DRIVERS}


def make_driver(driver_name: str, device: str, settings: TransportSettings, audit: AuditSink | None = None) -> Any:
    """Build the driver `driver_name` for `device`; no I/O happens until its first call."""
    factory = DRIVERS.get(driver_name)
    if factory is None:
        known = available_drivers()
        if driver_name not in known:
            raise ValueError(
                f"{device}: unknown driver {driver_name!r}; known drivers: {', '.join(sorted(known))} "
                f"(third-party drivers register under the {ENTRY_POINT_GROUP!r} entry-point group)"
            )
        factory = known[driver_name].load()  # an EntryPoint: import its package only when used
    return factory(device, settings, audit)
