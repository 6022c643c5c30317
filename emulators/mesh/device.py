"""The twin adapter for kind "photonic_mesh": one chip, its Qontrol pty and its SCPI source on TCP."""

from __future__ import annotations

import asyncio
import time

from emulators.endpoints import PtyEndpoint, TcpEndpoint
from emulators.mesh.chip import MeshChip
from emulators.mesh.qontrol import QontrolEngine
from emulators.mesh.scpi_source import MeshScpiEngine
from emulators.mesh.spec import MeshSpec


class MeshDevice:
    kind = "photonic_mesh"
    control_ops = MeshChip.control_ops

    def __init__(self, spec: MeshSpec) -> None:
        self.name = spec.name
        self.chip = MeshChip(spec, clock=time.monotonic)  # = the asyncio loop's clock
        self.qontrol = QontrolEngine(self.chip, device_id=spec.device_id)
        self.scpi = MeshScpiEngine(self.chip, spec.idn)
        self._pty = PtyEndpoint(self.qontrol)
        self._tcp = TcpEndpoint(self.scpi)

    def __getattr__(self, op: str):
        if op in MeshChip.control_ops and op != "reset":
            return getattr(self.chip, op)
        raise AttributeError(op)

    def reset(self) -> None:
        self.chip.reset()
        self.qontrol.reset()
        self.scpi.reset_status()

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        address = await self._tcp.start()
        pty = self._pty.start(loop)
        # "serial" repeats the Qontrol pty for tools that list every device's serial line (testbed emulate).
        return {
            "qontrol": pty,
            "visa": f"TCPIP0::{self._tcp.host}::{self._tcp.port}::SOCKET",
            "tcp": address,
            "serial": pty,
        }

    async def close(self) -> None:
        await self._tcp.close()
        self._pty.close()
