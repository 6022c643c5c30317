"""Driver names used in inventories -> what each driver is: the device family it drives, the transports it
runs over, the factory that builds it for one device, and its audit model (what the commands it sends mean
for the device's state, for `testbed check`), if it has one.

A factory takes (device, settings, audit) and returns a driver object implementing its family's capability
(drivers.capabilities). It opens its own transport, so a family that is not line-oriented (SSH hosts) fits the
same table. Nothing is connected yet when a driver is made: transports connect on first use.

Third-party drivers register a DriverSpec (or a list of them) under the `testbed.drivers` entry-point group,
e.g. in their pyproject.toml:

    [project.entry-points."testbed.drivers"]
    calient-tl1 = "mylab.calient:DRIVER"

A bare factory function is accepted too, for any family and transport (nothing is checked at load then).
The table is a testbed.contracts.registry.Registry, as every other of the framework's seams.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from drivers.audit import AuditSink
from drivers.netconf import make_polatis_netconf, polatis_netconf_audit
from drivers.tl1 import calient_tl1_audit, make_calient_tl1, make_polatis_tl1, polatis_tl1_audit
from drivers.transports import TransportSettings, open_transport
from testbed.contracts.registry import Registry

if TYPE_CHECKING:
    from drivers.gpuhost import GpuHostSsh
    from drivers.mesh import QontrolMesh, ScpiMesh
    from drivers.scpi.audit import PolatisAuditModel, Write
    from drivers.scpi.polatis import PolatisScpi
    from drivers.transports.ssh_settings import SshSettings

ENTRY_POINT_GROUP = "testbed.drivers"

# A factory: (device, its transport's settings, the audit sink) -> the driver. Its settings are of the type its own
# transport takes (TransportSettings, SshSettings, Tl1Settings...), and the driver it returns implements its own
# family's capability (drivers.capabilities), neither of which one type for every driver can say: the table's
# callers hand the settings a device's transport made, and pass the driver to that family's procedures.
DriverFactory: TypeAlias = Callable[[str, Any, AuditSink | None], Any]


class AuditModel(Protocol):
    """What the commands a driver sends mean for a switch's circuits (drivers/scpi/audit.py), for `testbed check`."""

    def replay(self, circuits: dict[int, int], lines: list[str], /) -> dict[int, int]:
        """The circuits (ingress -> egress) after `lines` were sent, starting from `circuits`."""

    def writes(self, line: str, /) -> Sequence[Write]:
        """The writes one sent line names (none for a query)."""


@dataclass(frozen=True)
class DriverSpec:
    """One driver: the family it drives, the transports it runs over, its factory, its audit model, its twin."""

    name: str
    family: str | None  # the inventory `kind` it drives; None: any (a bare factory from an entry point)
    transports: tuple[str, ...] | None  # transport types it runs over; None: any
    factory: DriverFactory
    # (switch size) -> an object with replay(circuits, lines) and writes(line) (drivers/scpi/audit.py)
    audit_model: Callable[[int], AuditModel] | None = None
    # the twin's front end that speaks this protocol (emulators/frontends.py), so the twin serves it
    frontend: str | None = None


def _polatis_scpi(device: str, settings: TransportSettings, audit: AuditSink | None) -> PolatisScpi:
    from drivers.scpi.polatis import PolatisScpi

    return PolatisScpi(open_transport(settings, device, audit), device)


def _polatis_audit(size: int) -> PolatisAuditModel:
    from drivers.scpi.audit import PolatisAuditModel

    return PolatisAuditModel(size)


def _ssh_gpu_host(device: str, settings: SshSettings, audit: AuditSink | None) -> GpuHostSsh:
    # Imported here: paramiko loads only for labs with SSH hosts.
    from drivers.gpuhost import GpuHostSsh
    from drivers.transports.ssh import SshTransport

    return GpuHostSsh(SshTransport(settings, device, audit), device)


def _qontrol_mesh(device: str, settings: TransportSettings, audit: AuditSink | None) -> QontrolMesh:
    from drivers.mesh import QontrolMesh

    return QontrolMesh(open_transport(settings, device, audit), device)


def _scpi_mesh(device: str, settings: TransportSettings, audit: AuditSink | None) -> ScpiMesh:
    from drivers.mesh import ScpiMesh

    return ScpiMesh(open_transport(settings, device, audit), device)


def _from_entry_point(ep: EntryPoint, obj: object) -> list[DriverSpec]:
    """A DriverSpec (named as its entry point), a list of them (the one named as the entry point), or a bare
    factory function (any family and transport: nothing is checked at load then).
    """
    if isinstance(obj, DriverSpec):
        return [obj if obj.name == ep.name else replace(obj, name=ep.name)]
    if isinstance(obj, list | tuple):
        return [d for d in obj if isinstance(d, DriverSpec) and d.name == ep.name]
    if callable(obj):
        return [DriverSpec(ep.name, None, None, obj)]
    return []


BUILTIN_DRIVERS = (
    DriverSpec("polatis-scpi", "ocs", ("visa", "serial"), _polatis_scpi, _polatis_audit, "scpi"),
    DriverSpec("qontrol-mesh", "photonic_mesh", ("serial", "visa"), _qontrol_mesh),
    DriverSpec("scpi-mesh", "photonic_mesh", ("visa", "serial"), _scpi_mesh),
    DriverSpec("ssh", "gpu_host", ("ssh",), _ssh_gpu_host),
    DriverSpec("polatis-netconf", "ocs", ("netconf",), make_polatis_netconf, polatis_netconf_audit, "netconf"),
    DriverSpec("polatis-tl1", "ocs", ("tl1",), make_polatis_tl1, polatis_tl1_audit, "tl1-polatis"),
    DriverSpec("calient-tl1", "ocs", ("tl1",), make_calient_tl1, calient_tl1_audit, "tl1-calient"),
)


def driver_registry() -> Registry[DriverSpec]:
    """The built-in drivers, and the entry points of installed packages once it is read. A built-in wins over an
    entry point of the same name, so an installed package cannot silently replace a driver the project ships.
    """
    registry: Registry[DriverSpec] = Registry("driver", ENTRY_POINT_GROUP, lambda d: d.name, _from_entry_point)
    for spec in BUILTIN_DRIVERS:
        registry.register(spec, builtin=True)
    return registry


DRIVERS = driver_registry()


def available_drivers() -> list[str]:
    """The names of the built-in drivers and of every installed package's."""
    return DRIVERS.names()


def driver_spec(name: str) -> DriverSpec | None:
    """What the driver `name` is; None if no built-in driver or installed package has that name."""
    return DRIVERS.get(name) if name in DRIVERS else None


def make_driver(driver_name: str, device: str, settings: object, audit: AuditSink | None = None) -> Any:
    """Build the driver `driver_name` for `device` over its transport's `settings`; no I/O happens until its first
    call. The driver implements its family's capability (drivers.capabilities), hence Any (DriverFactory says why).
    """
    spec = driver_spec(driver_name)
    if spec is None:
        raise ValueError(
            f"{device}: unknown driver {driver_name!r}; known drivers: {', '.join(sorted(available_drivers()))} "
            f"(third-party drivers register under the {ENTRY_POINT_GROUP!r} entry-point group)"
        )
    return spec.factory(device, settings, audit)
