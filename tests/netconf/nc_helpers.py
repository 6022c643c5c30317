"""Helpers of the NETCONF tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from drivers.netconf.polatis import PolatisNetconf
from drivers.netconf.settings import NetconfSettings
from emulators import spec as spec_mod
from emulators.netconf.frontend import NetconfFrontend
from emulators.scpi.ocs import PolatisEngine

SIZE = 8  # ingress 1..8, egress 9..16
LIT = {1: 0.0, 2: -3.0}  # dBm arriving on ingress ports


def ocs_spec(name: str = "ocs1", **kw: Any) -> spec_mod.OcsSpec:
    args = {"size": SIZE, "input_power_dbm": dict(LIT), "switching_time_ms": 25, "jitter_ms": 0, **kw}
    return spec_mod.OcsSpec(name=name, frontends=["scpi", "netconf"], user="admin", **args)


def settings_for(endpoints: dict[str, str], **kw: Any) -> NetconfSettings:
    host, _, port = endpoints["netconf"].rpartition(":")
    args = {"key_file": endpoints["key_file"], "known_hosts": endpoints["known_hosts"], "timeout_s": 5.0, **kw}
    return NetconfSettings(host, int(port), "admin", **args)


class LocalSwitch:
    """A switch model with its NETCONF front end served on `loop` (a thread of this process)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, spec: spec_mod.OcsSpec, **options: Any) -> None:
        self.loop = loop
        self.spec = spec
        self.engine = PolatisEngine(spec)
        self.frontend = NetconfFrontend(self.engine, spec, **options)
        self.endpoints = asyncio.run_coroutine_threadsafe(self.frontend.start(loop), loop).result(10)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run fn where the engine lives (its loop) and return what it returns."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def driver(self, audit=None, **kw: Any) -> PolatisNetconf:
        return PolatisNetconf(settings_for(self.endpoints), self.spec.name, audit, **kw)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.frontend.close(), self.loop).result(20)
