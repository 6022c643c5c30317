"""The panel's emulator for the twin: a TCP server speaking its protocol, the arm's move taking `move_ms`.
Named to the twin by reference (TwinSupport.refs), so the twin imports it only when it serves a panel.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from patchpanel.protocol import CONN, DISC


@dataclass
class PanelSpec:
    name: str
    size: int = 16
    move_ms: float = 5.0
    lit: dict = field(default_factory=dict)  # ingress -> dBm arriving
    kind: str = "patch_panel"

    @classmethod
    def from_dict(cls, d: dict) -> PanelSpec:
        return cls(**{**d, "lit": {int(k): float(v) for k, v in d.get("lit", {}).items()}})


class PanelAdapter:
    kind = "patch_panel"
    control_ops = ("state", "reset")

    def __init__(self, spec: PanelSpec) -> None:
        self.name = spec.name
        self.spec = spec
        self.reset()
        self._server = None

    def reset(self) -> None:
        self.circuits: dict[int, int] = {}
        self.busy_until = 0.0

    def state(self) -> dict:
        return {"connections": sorted([i, e] for i, e in self.circuits.items())}

    def handle(self, line: str) -> str:
        n = self.spec.size
        if line == "*IDN?":
            return "Acme,PANEL-16,0001,1.0"
        if line == "SIZE?":
            return str(n)
        if line == "CONN?":
            return ",".join(f"{i}>{e}" for i, e in sorted(self.circuits.items()))
        if line == "BUSY?":
            return "1" if time.monotonic() < self.busy_until else "0"
        if line.startswith("POW? "):
            egress = int(line.split()[1])
            ingress = next((i for i, e in self.circuits.items() if e == egress), None)
            return f"{self.spec.lit.get(ingress, -60.0) - 1.0:.2f}" if ingress in self.spec.lit else "-60.00"
        if m := CONN.match(line):
            i, e = int(m.group(1)), int(m.group(2))
            if not (1 <= i <= n < e <= 2 * n):
                return f"ERR ports {i},{e} out of range"
            if e in self.circuits.values() and self.circuits.get(i) != e:
                return f"ERR egress {e} is in use"
            self.circuits[i] = e
            self.busy_until = time.monotonic() + self.spec.move_ms / 1000
            return "OK"
        if m := DISC.match(line):
            self.circuits.pop(int(m.group(1)), None)
            return "OK"
        return "ERR unknown command"

    async def _serve(self, reader, writer) -> None:
        try:
            while line := await reader.readline():
                writer.write((self.handle(line.decode().strip()) + "\n").encode())
                await writer.drain()
        finally:
            writer.close()

    async def start(self, loop) -> dict[str, str]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return {"tcp": f"127.0.0.1:{port}", "visa": f"TCPIP0::127.0.0.1::{port}::SOCKET"}

    async def close(self) -> None:
        self._server.close()
