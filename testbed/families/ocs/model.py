"""An optical circuit switch in the inventory: its ports, which of them a run may touch, and how the twin
emulates it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.config.common import PortList, Strict
from testbed.config.device import SwitchConfig


class OcsEmulation(Strict):
    """How the twin emulates the switch: its timing, its loss, its identity, the circuits it starts with."""

    switching_time_ms: float = Field(default=25.0, ge=0, le=60_000)
    jitter_ms: float = Field(default=0.5, ge=0, le=10_000)
    insertion_loss_db: float = Field(default=1.0, ge=0, le=60)
    idn: str = "Polatis,N-OST-32x32-LU1-DMHNS,000001,6.5.2.18"
    circuits: list[tuple[int, int]] = Field(
        default_factory=list,
        description="[ingress, egress] circuits the emulated switch holds when the twin starts: the lab as "
        "another group left it (on reserved ports, say), to rehearse a run against it",
    )


class OcsDevice(SwitchConfig):
    """An optical circuit switch (kind ocs): ingress ports 1..N, egress N+1..2N, and the ports a run may touch."""

    kind: Literal["ocs"]
    allowed_ports: PortList | None = Field(default=None, description="ports a run may touch; default all")
    reserved_ports: PortList = Field(default_factory=list, description="ports a run must never touch")
    emulation: OcsEmulation = OcsEmulation()

    def port_allowed(self, port: int) -> bool:
        """Whether a run may touch `port`: not reserved, and among allowed_ports if those are given."""
        if port in self.reserved_ports:
            return False
        return self.allowed_ports is None or port in self.allowed_ports

    def port_reserved(self, port: int) -> bool:
        """Whether `port` is reserved: a run must never touch it."""
        return port in self.reserved_ports

    def pass_loss_db(self) -> float:
        """Loss of light crossing the switch once (ingress -> egress), as the planner budgets it: the
        insertion loss the twin also emulates (`emulation.insertion_loss_db`).
        """
        return self.emulation.insertion_loss_db
