"""How the twin serves each kind of device: one small adapter per kind (emulators/kinds.py names them).

An emulated device is a transport-free engine (state, grammar, timing) plus the endpoints it is reached
on. The twin asks each adapter to start its endpoints on the twin's event loop and to answer control
ops; it knows nothing else about the kind. A new kind adds its spec dataclass and its adapter, and names
them in emulators/kinds.py (or, from another package, in the twin spec's `kinds`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Protocol

from emulators.endpoints import PtyEndpoint, TcpEndpoint
from emulators.frontends import frontend_class
from emulators.kinds import adapter_class
from emulators.scpi.ocs import PolatisEngine
from emulators.scpi.replay import ScpiReplay, engine_with
from emulators.spec import OcsSpec


class EmulatedDevice(Protocol):
    name: str
    kind: str
    control_ops: tuple[str, ...]  # methods callable through the twin's control API

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        """Open the endpoints; return them by role, e.g. {"visa": ..., "serial": ...}."""

    async def close(self) -> None: ...


def build_device(spec: Any, kinds: Mapping[str, tuple[str, str]] | None = None) -> EmulatedDevice:
    return adapter_class(spec.kind, kinds)(spec)


class OcsDevice:
    """An optical circuit switch: one switch model, served on the interfaces its spec lists (OcsSpec.frontends):
    SCPI on a TCP port (LAN, 5025 in the lab) and a raw pty (RS-232 console), and the front ends of
    emulators/frontends.py (TL1, NETCONF), all on one engine, as one switch has all of them.
    """

    kind = "ocs"

    def __init__(self, spec: OcsSpec) -> None:
        self.name = spec.name
        self.spec = spec
        self.engine = PolatisEngine(spec, clock=time.monotonic)  # = the asyncio loop's clock
        self.control_ops = self.engine.control_ops
        self._tcp = TcpEndpoint(self.engine)
        self._pty = PtyEndpoint(self.engine)
        self._frontends = [frontend_class(name)(self.engine, spec) for name in spec.frontends if name != "scpi"]

    def __getattr__(self, op: str):
        # Control ops are the engine's (fail_port, reset, state, ...).
        if op in PolatisEngine.control_ops:
            return getattr(self.engine, op)
        raise AttributeError(op)

    def attach_truth(self, truth) -> None:
        """Log the ports taken out of service and back in the twin's ground truth (emulators/truth.py)."""
        self.engine.truth = truth

    @staticmethod
    def replay_session(spec: OcsSpec, circuits: dict | None):
        """A fresh engine in the state a run found the switch in, behind the front end the run's driver spoke
        (the one its spec lists besides SCPI, else SCPI), for replaying that run's audit log (`testbed
        replay`, emulators/scpi/replay.py). None for a front end that cannot replay.
        """
        engine = engine_with(spec, circuits)
        others = [name for name in spec.frontends if name != "scpi"]
        if not others:
            return ScpiReplay(engine)
        replay = getattr(frontend_class(others[0]), "replay", None)
        return None if replay is None else replay(engine, spec)

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        endpoints: dict[str, str] = {}
        if "scpi" in self.spec.frontends:
            address = await self._tcp.start()
            endpoints.update(
                tcp=address,
                visa=f"TCPIP0::{self._tcp.host}::{self._tcp.port}::SOCKET",
                serial=self._pty.start(loop),
            )
        for frontend in self._frontends:
            endpoints.update(await frontend.start(loop))
        endpoints["interfaces"] = ",".join(self.spec.frontends)  # which protocols the endpoints speak
        return endpoints

    async def close(self) -> None:
        if "scpi" in self.spec.frontends:
            await self._tcp.close()
            self._pty.close()
        for frontend in self._frontends:
            await frontend.close()
