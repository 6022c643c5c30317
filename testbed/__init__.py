"""testbed: experiments on photonic ML-datacenter testbeds, on the lab or on its emulated twin.

The names below are the public API for other packages (a device family, a driver, a step kind, a fault kind)
and for scripts; everything else is private to its module and may change. See docs/architecture.md.

They are loaded on first use: the drivers import drivers.capabilities, and that must not load the engine.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    # what a device can do (typing.Protocols) and what it says about itself
    "CircuitSwitch": "drivers.capabilities",
    "PhotonicMesh": "drivers.capabilities",
    "GpuHost": "drivers.capabilities",
    "Identity": "drivers.capabilities",
    # device families
    "DeviceFamily": "testbed.families",
    "ProcedureSpec": "testbed.families",
    "TwinSupport": "testbed.families",
    "FAMILIES": "testbed.families",
    "ProcedureContext": "testbed.families.context",
    "DeviceConfig": "testbed.config.device",
    "SwitchConfig": "testbed.config.device",
    "TransportConfig": "testbed.config.transports",
    "TRANSPORTS": "testbed.config.device",
    "Policy": "testbed.families.interlocks",
    # drivers
    "DriverSpec": "testbed.families.drivers",
    # step kinds
    "StepModel": "testbed.steps",
    "Planned": "testbed.steps",
    "Touches": "testbed.steps",
    "CheckContext": "testbed.steps",
    "PlanContext": "testbed.steps",
    "STEP_KINDS": "testbed.steps",
    # fault kinds
    "FaultKind": "testbed.faults",
    "FaultEnv": "testbed.faults",
    "Injected": "testbed.faults",
    "RankTarget": "testbed.faults",
    "ConnectionTarget": "testbed.faults",
    "FAULT_KINDS": "testbed.faults",
    # the registries' common type
    "Registry": "testbed.contracts.registry",
    # inventories, playbooks, plans
    "load_inventory": "testbed.documents",
    "load_playbook": "testbed.documents",
    "make_plan": "testbed.plan",
    "PlanError": "testbed.plan",
    # a warm session on a lab (IPython, Jupyter) and the runs it makes
    "Lab": "testbed.lab",
    "Run": "testbed.engine.run",
    # the runs of results folders, from their catalog, as a pandas DataFrame (docs/catalog.md)
    "runs": "testbed.catalog.frame",
    # results
    "Op": "testbed.events",
    "Event": "testbed.events",
    "read_jsonl": "testbed.events",
    # errors
    "UserError": "testbed.contracts.errors",
    "ConfigError": "testbed.contracts.errors",
    "ExperimentFailed": "testbed.contracts.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'testbed' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
