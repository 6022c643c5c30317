"""The management interfaces an emulated switch may have besides SCPI: each a front end on the one switch
model (emulators/scpi/ocs.py's PolatisEngine: circuits, switching time, dark moving ports, light), as one real
switch answers on SCPI, TL1 and NETCONF at once. The twin starts the front ends a switch's spec lists
(OcsSpec.frontends), so it serves what the inventory's driver speaks.

A front end is a class `Frontend(engine, spec)` with `async start(loop) -> {role: endpoint}` and
`async close()`, named here as "module:Class" and imported only when a switch uses it.

The emulated switches accept their user (OcsSpec.user) with TWIN_PASSWORD: a twin listens on 127.0.0.1
only, so the password is no secret; the framework hands it to its drivers through the environment variable
TWIN_PASSWORD_ENV (testbed/twin/bridge.py), never through a file.
"""

from __future__ import annotations

import importlib

FRONTENDS: dict[str, str] = {
    "tl1-polatis": "emulators.tl1.frontend:PolatisTl1Frontend",
    "tl1-calient": "emulators.tl1.frontend:CalientTl1Frontend",
    "netconf": "emulators.netconf.frontend:NetconfFrontend",
}

TWIN_PASSWORD = "twin"  # noqa: S105 (a loopback-only emulator's published password, not a secret)
TWIN_PASSWORD_ENV = "TESTBED_TWIN_PASSWORD"  # noqa: S105 (the name of a variable, not a password)


def frontend_class(name: str) -> type:
    if name not in FRONTENDS:
        raise ValueError(f"unknown switch front end {name!r} (known: scpi, {', '.join(sorted(FRONTENDS))})")
    module, _, attr = FRONTENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
