"""The twin adapter for kind "photonic_mesh": one chip, its Qontrol pty and its SCPI source on TCP.

The Qontrol pty is announced twice: "qontrol" is the pty itself (/dev/pts/N), "qontrol_link" a symlink to
it in a private directory that keeps its name when the device is unplugged and plugged back (as
/dev/serial/by-id/... does for a USB adapter, whose /dev/ttyUSBn may change). Serial-line faults, control
ops on the device's name (the TCP endpoint's faults are the fault proxy's, see emulators/twin.py):

    serial_fault  kind, delay_ms=0   kind: one of emulators.mesh.qontrol.LINE_FAULTS (the reply is changed
                                     on its way back), or "gone": the pty is closed, as a USB adapter pulled
                                     out (the client's reads and writes fail, the path disappears)
    serial_heal                      every serial fault cleared; a gone pty comes back (a new /dev/pts/N,
                                     the same link); returns {"qontrol", "qontrol_link", "replies_pending"}:
                                     late replies still to come, in order, before any new one (the line is
                                     clear once it is 0)

`reset` heals the line too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from emulators.endpoints import PtyEndpoint, TcpEndpoint
from emulators.mesh.chip import MeshChip
from emulators.mesh.qontrol import LINE_FAULTS, QontrolEngine
from emulators.mesh.scpi_source import MeshScpiEngine
from emulators.mesh.spec import MeshSpec


class MeshDevice:
    kind = "photonic_mesh"
    control_ops = (*MeshChip.control_ops, "serial_fault", "serial_heal")

    def __init__(self, spec: MeshSpec) -> None:
        self.name = spec.name
        self.chip = MeshChip(spec, clock=time.monotonic)  # = the asyncio loop's clock
        self.qontrol = QontrolEngine(self.chip, device_id=spec.device_id)
        self.scpi = MeshScpiEngine(self.chip, spec.idn)
        self._pty: PtyEndpoint | None = PtyEndpoint(self.qontrol)
        self._tcp = TcpEndpoint(self.scpi)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link_dir: Path | None = None

    def __getattr__(self, op: str):
        if op in MeshChip.control_ops and op != "reset":
            return getattr(self.chip, op)
        raise AttributeError(op)

    def reset(self) -> None:
        self.chip.reset()
        self.qontrol.reset()
        self.scpi.reset_status()
        self.serial_heal()

    # -- serial-line faults -------------------------------------------------------------------------

    def serial_fault(self, kind: str, delay_ms: float = 0.0) -> None:
        if kind == "gone":
            if self._pty is not None:
                self._pty.close()
                self._pty = None
            return
        if kind not in LINE_FAULTS:
            raise ValueError(f"unknown serial fault {kind!r} (faults: {', '.join((*LINE_FAULTS, 'gone'))})")
        self.qontrol.set_line_fault(kind, delay_ms)

    def serial_heal(self) -> dict[str, str | int]:
        self.qontrol.set_line_fault(None)
        if self._pty is None and self._loop is not None:
            self._pty = PtyEndpoint(self.qontrol)
            self._link(self._pty.start(self._loop))
        return self._serial_endpoints()

    def _link(self, pty: str) -> None:
        """Point the stable link at `pty`, atomically (a client opening it sees the old or the new pty)."""
        assert self._link_dir is not None
        staging = self._link_dir / "staging"
        staging.unlink(missing_ok=True)
        staging.symlink_to(pty)
        os.replace(staging, self._link_dir / f"{self.name}-qontrol")

    def _serial_endpoints(self) -> dict[str, str | int]:
        assert self._link_dir is not None
        return {
            "qontrol": self._pty.path if self._pty else "",
            "qontrol_link": str(self._link_dir / f"{self.name}-qontrol"),
            "replies_pending": self.qontrol.replies_pending(time.monotonic()),  # the loop's clock
        }

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self, loop: asyncio.AbstractEventLoop) -> dict[str, str]:
        self._loop = loop
        address = await self._tcp.start()
        assert self._pty is not None
        pty = self._pty.start(loop)
        self._link_dir = Path(tempfile.mkdtemp(prefix="testbed-serial-"))
        self._link(pty)
        # "serial" repeats the Qontrol pty for tools that list every device's serial line (testbed emulate).
        return {
            "qontrol": pty,
            "qontrol_link": str(self._link_dir / f"{self.name}-qontrol"),
            "visa": f"TCPIP0::{self._tcp.host}::{self._tcp.port}::SOCKET",
            "tcp": address,
            "serial": pty,
        }

    async def close(self) -> None:
        await self._tcp.close()
        if self._pty is not None:
            self._pty.close()
        if self._link_dir is not None:
            shutil.rmtree(self._link_dir, ignore_errors=True)
