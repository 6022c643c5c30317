"""The management interfaces an emulated switch may have besides SCPI: each a front end on the one switch
model (emulators/scpi/ocs.py's PolatisEngine: circuits, switching time, dark moving ports, light), as one real
switch answers on SCPI, TL1 and NETCONF at once. The twin starts the front ends a switch's spec lists
(OcsSpec.frontends), so it serves what the inventory's driver speaks.

A front end is a class `Frontend(engine, spec)` with `async start(loop) -> {role: endpoint}` and
`async close()`, named here as "module:Class" and imported only when a switch uses it.

The emulated switches (and BMCs) accept their user (OcsSpec.user) with the twin's password (TwinSpec.password,
`twin_password()` in the twin's process): TWIN_PASSWORD unless the twin was given another, as `testbed run --emulate`
and `testbed emulate` give each twin a random one. The framework hands it to its drivers through the environment
variable TWIN_PASSWORD_ENV (testbed/twin/bridge.py), never through a file.
"""

from __future__ import annotations

import importlib

FRONTENDS: dict[str, str] = {
    "tl1-polatis": "emulators.tl1.frontend:PolatisTl1Frontend",
    "tl1-calient": "emulators.tl1.frontend:CalientTl1Frontend",
    "netconf": "emulators.netconf.frontend:NetconfFrontend",
}

TWIN_PASSWORD = "twin"  # noqa: S105 (the published default, TwinSpec.password's, for a twin started by hand)
TWIN_PASSWORD_ENV = "TESTBED_TWIN_PASSWORD"  # noqa: S105 (the name of a variable, not a password)
_password = TWIN_PASSWORD


def twin_password() -> str:
    """The password this process's twin accepts (one twin per process: set once it starts)."""
    return _password


def set_twin_password(password: str) -> None:
    global _password
    _password = password


def frontend_class(name: str) -> type:
    if name not in FRONTENDS:
        raise ValueError(f"unknown switch front end {name!r} (known: scpi, {', '.join(sorted(FRONTENDS))})")
    module, _, attr = FRONTENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
