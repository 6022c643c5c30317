"""The lab inventory: devices, how to reach them, how they are cabled, and what may be touched.

Validated once, at load (testbed.config.load); everything after that works on these frozen models.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from testbed.config.common import Name, PortList, Strict

# --- transports -------------------------------------------------------------------------------


class VisaTransport(Strict):
    type: Literal["visa"]
    resource: str = Field(
        description="VISA resource, e.g. 'TCPIP0::10.0.0.5::5025::SOCKET' or 'ASRL/dev/ttyUSB0::INSTR'"
    )
    timeout_ms: int = Field(2000, gt=0, le=600_000)
    read_termination: str = Field("\n", min_length=1, description="end of every reply (a trailing \\r is dropped)")
    write_termination: str = "\n"


class SerialTransport(Strict):
    type: Literal["serial"]
    port: str = Field(description="device path ('/dev/ttyUSB0') or pyserial URL ('socket://10.0.0.5:5025')")
    baudrate: int = Field(38400, gt=0)
    timeout_ms: int = Field(2000, gt=0, le=600_000)
    read_termination: str = Field("\n", min_length=1, description="end of every reply (a trailing \\r is dropped)")
    write_termination: str = "\n"


class SshTransport(Strict):
    type: Literal["ssh"]
    host: str
    port: int = Field(22, ge=1, le=65535)
    user: str
    key_file: str | None = Field(None, description="private key; omit to use the SSH agent")
    known_hosts: str | None = Field(None, description="known_hosts file; default ~/.ssh/known_hosts")
    timeout_ms: int = Field(10000, gt=0, le=600_000)


Transport = Annotated[VisaTransport | SerialTransport | SshTransport, Field(discriminator="type")]


def transport_address(t: VisaTransport | SerialTransport | SshTransport) -> str:
    if isinstance(t, VisaTransport):
        return t.resource
    if isinstance(t, SerialTransport):
        return t.port
    return f"{t.user}@{t.host}:{t.port}"


# --- devices ------------------------------------------------------------------------------------


class _Device(Strict):
    driver: str = Field(description="driver name, e.g. 'polatis-scpi'")
    transport: Transport
    node: str | None = Field(None, description="Ray node (control host) the device's actor must run on")
    read_only: bool = Field(False, description="never write to this device")
    description: str = ""


class OcsEmulation(Strict):
    switching_time_ms: float = Field(25.0, ge=0, le=60_000)
    jitter_ms: float = Field(0.5, ge=0, le=10_000)
    insertion_loss_db: float = Field(1.0, ge=0, le=60)
    idn: str = "Polatis,N-OST-32x32-LU1-DMHNS,000001,6.5.2.18"
    circuits: list[tuple[int, int]] = Field(
        default_factory=list,
        description="[ingress, egress] circuits the emulated switch holds when the twin starts: the lab as "
        "another group left it (on reserved ports, say), to rehearse a run against it",
    )


class OcsDevice(_Device):
    kind: Literal["ocs"]
    size: int = Field(ge=1, le=1024, description="ports per side: ingress 1..size, egress size+1..2*size")
    allowed_ports: PortList | None = Field(None, description="ports a run may touch; default all")
    reserved_ports: PortList = Field(default_factory=list, description="ports a run must never touch")
    emulation: OcsEmulation = OcsEmulation()

    def port_allowed(self, port: int) -> bool:
        if port in self.reserved_ports:
            return False
        return self.allowed_ports is None or port in self.allowed_ports

    def pass_loss_db(self) -> float:
        """Loss of light crossing the switch once (ingress -> egress), as the planner budgets it: the
        insertion loss the twin also emulates (`emulation.insertion_loss_db`)."""
        return self.emulation.insertion_loss_db


class MeshEmulation(Strict):
    settling_time_us: float = Field(4.0, ge=0)
    drive: Literal["voltage", "current"] = "current"
    crosstalk: float = Field(0.02, ge=0, le=1)
    insertion_loss_db: float = Field(0.1, ge=0, le=10)
    heater_resistance_ohm: float = Field(1000.0, gt=0, le=1e6)
    p_pi_mw: float = Field(30.0, gt=0, le=1000, description="nominal heater power for a pi phase shift")
    alpha_spread: float = Field(0.05, ge=0, le=0.5, description="relative per-heater spread of the efficiency")
    phi0_spread_rad: float = Field(6.283185307179586, ge=0, le=6.283185307179586)
    noise_rel: float = Field(0.002, ge=0, le=0.5, description="photodiode relative noise (1 sigma)")


class MeshDevice(_Device):
    kind: Literal["photonic_mesh"]
    size: int = Field(8, ge=2, le=256, description="optical ports per side")
    emulation: MeshEmulation = MeshEmulation()

    def pass_loss_db(self) -> float:
        """Loss of light crossing the chip once, as the planner budgets it: every path goes through a
        splitter tree and a combiner tree of log2(size) cells each, `emulation.insertion_loss_db` per cell
        (what the twin's chip emulates)."""
        return self.emulation.insertion_loss_db * 2 * math.ceil(math.log2(self.size))


class GpuHostEmulation(Strict):
    gpu_name: str = "NVIDIA H100 80GB HBM3"


class GpuHostDevice(_Device):
    kind: Literal["gpu_host"]
    gpus: int = Field(8, ge=0, le=64)
    ports: list[Name] = Field(default_factory=lambda: ["p0"], description="optical ports (NICs) of the host")
    rack: str | None = None
    emulation: GpuHostEmulation = GpuHostEmulation()


Device = Annotated[OcsDevice | MeshDevice | GpuHostDevice, Field(discriminator="kind")]


class FibreEmulation(Strict):
    """Where this fibre really lands in the emulated twin, when that differs from the map: a cabling
    mistake to rehearse (the planner trusts the map; the twin's light and data plane follow the cable)."""

    ingress: int | None = Field(None, ge=1)
    egress: int | None = Field(None, ge=1)


class Fibre(Strict):
    """One host port cabled to a switch: host transmit -> switch ingress, switch egress -> host receive."""

    host: Name
    port: Name
    switch: Name
    ingress: int = Field(ge=1)
    egress: int = Field(ge=1)
    launch_power_dbm: float = Field(0.0, ge=-40, le=20, description="transceiver output power")
    rx_sensitivity_dbm: float = Field(
        -20.0,
        ge=-60,
        le=20,
        description="the weakest light the host's receiver detects: a path to this port is usable while the "
        "sender's launch_power_dbm minus the path's loss stays at or above it (the loss budget)",
    )
    emulation: FibreEmulation | None = None

    def actual(self) -> tuple[int, int]:
        """(ingress, egress) as cabled in the twin."""
        e = self.emulation
        return ((e.ingress or self.ingress) if e else self.ingress, (e.egress or self.egress) if e else self.egress)


class Trunk(Strict):
    """One switch-to-switch fibre, one direction: light leaving switch `from` on its egress port `egress`
    enters switch `to` on its ingress port `ingress`. A duplex trunk is two entries. The planner routes a
    link whose hosts are cabled to different switches over trunks (one circuit per switch on the way), and
    a trunk carries one circuit at a time."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: Name = Field(alias="from", description="the switch the light leaves (on its egress port `egress`)")
    egress: int = Field(ge=1, description="egress port of `from`")
    to: Name = Field(description="the switch the light enters (on its ingress port `ingress`)")
    ingress: int = Field(ge=1, description="ingress port of `to`")
    loss_db: float = Field(0.0, ge=0, le=60, description="loss of the fibre and its connectors")

    @property
    def label(self) -> str:
        return f"{self.from_}:{self.egress} -> {self.to}:{self.ingress}"


class Inventory(Strict):
    name: Name
    description: str = ""
    emulated_only: bool = Field(False, description="addresses are placeholders: refuse runs without --emulate")
    devices: dict[Name, Device]
    fibres: list[Fibre] = Field(default_factory=list)
    trunks: list[Trunk] = Field(
        default_factory=list,
        description="switch-to-switch fibres, one direction each: {from, egress, to, ingress, loss_db}",
    )
    spares: list[Name] = Field(default_factory=list)

    def switches(self) -> dict[str, OcsDevice | MeshDevice]:
        return {n: d for n, d in self.devices.items() if isinstance(d, OcsDevice | MeshDevice)}

    def fibre_of(self, host: str, port: str) -> Fibre | None:
        return next((f for f in self.fibres if f.host == host and f.port == port), None)
