"""Fault kinds, each one definition (testbed.faults.base.FaultKind), registered by name. Another package adds
its own under the `testbed.faults` entry-point group.
"""

from __future__ import annotations

from testbed.contracts.registry import Registry
from testbed.faults.base import FaultEnv, FaultFailed, FaultKind, Injected, RankTarget
from testbed.faults.link import LINK_FAULTS
from testbed.faults.power import POWER_FAULTS
from testbed.faults.rank import RANK_FAULTS
from testbed.faults.straggle import STRAGGLE_FAULTS
from testbed.faults.transport import TRANSPORT_FAULTS, ConnectionTarget, TransportFault

FAULT_KINDS: Registry[FaultKind] = Registry("fault kind", "testbed.faults", lambda kind: kind.name)
_BUILTIN: tuple[FaultKind, ...] = (*RANK_FAULTS, *POWER_FAULTS, *STRAGGLE_FAULTS, *TRANSPORT_FAULTS, *LINK_FAULTS)
for _kind in _BUILTIN:
    FAULT_KINDS.register(_kind, builtin=True)


def fault_kind(name: str) -> FaultKind:
    """The registered fault kind of that name; RegistryError naming the known ones if there is none."""
    return FAULT_KINDS.get(name)


__all__ = [
    "FAULT_KINDS",
    "ConnectionTarget",
    "FaultEnv",
    "FaultFailed",
    "FaultKind",
    "Injected",
    "RankTarget",
    "TransportFault",
    "fault_kind",
]
