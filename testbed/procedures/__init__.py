"""Procedures run inside a device actor, next to the driver, so that their timestamps are taken where the
I/O happens. Each is a plain function `(driver, ctx, **kwargs) -> JSON-able value`."""

from __future__ import annotations

from collections.abc import Callable

from testbed.procedures import ocs
from testbed.procedures.context import ProcedureContext

Procedure = Callable[..., object]

PROCEDURES: dict[str, Procedure] = {
    "ocs.identify": ocs.identify,
    "ocs.reconfigure": ocs.reconfigure,
    "ocs.clear": ocs.clear,
    "ocs.connections": ocs.connections,
}

__all__ = ["PROCEDURES", "ProcedureContext"]
