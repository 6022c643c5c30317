"""Device families, registered by kind (testbed.families.base.DeviceFamily). Another package adds one under
the `testbed.families` entry-point group; its devices then validate in inventories, plan, run, check and heal
like the built-in ones.

PROCEDURES is every registered family's procedures, by name (what a device's actor runs,
and the marks each may take).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from testbed.config.device import DeviceConfig
from testbed.contracts.registry import Registry
from testbed.families import gpu_host, ocs, photonic_mesh
from testbed.families.base import DeviceFamily, Procedure, ProcedureSpec, TwinSupport

FAMILIES: Registry[DeviceFamily] = Registry("device family", "testbed.families", lambda family: family.kind)
for _family in (ocs.FAMILY, photonic_mesh.FAMILY, gpu_host.FAMILY):
    FAMILIES.register(_family, builtin=True)


def family(kind: str) -> DeviceFamily:
    """The family registered under `kind` (the inventory's `kind:`); a RegistryError if there is none."""
    return FAMILIES.get(kind)


def family_of(device: DeviceConfig) -> DeviceFamily:
    """The family of an inventory device."""
    return FAMILIES.get(device.kind)


class ProcedureMarks(dict[str, tuple[str, ...]]):
    """Procedure name -> the marks it may take, with the union of all marks (a snapshot: the recorder checks
    every event against it).
    """

    def __init__(self, marks: dict[str, tuple[str, ...]]) -> None:
        super().__init__(marks)
        self.device_marks = frozenset(m for ms in marks.values() for m in ms)


class _Procedures(Mapping[str, Procedure]):
    """Every family's procedures by name, read live from the registry."""

    def _all(self) -> dict[str, ProcedureSpec]:
        return {name: spec for f in FAMILIES for name, spec in f.procedures.items()}

    def __getitem__(self, name: str) -> Procedure:
        return self._all()[name].function

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def marks(self) -> ProcedureMarks:
        """Every procedure's marks, as the recorder checks events against them."""
        return ProcedureMarks({name: spec.marks for name, spec in self._all().items()})


PROCEDURES = _Procedures()


__all__ = ["FAMILIES", "PROCEDURES", "DeviceFamily", "ProcedureSpec", "TwinSupport", "family", "family_of"]
