"""How a lab is cabled: host ports to switch ports (fibres), switches to switches (trunks)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from testbed.config.common import Name, Strict


class FibreEmulation(Strict):
    """Where this fibre really lands in the emulated twin, when that differs from the map: a cabling
    mistake to rehearse (the planner trusts the map; the twin's light and data plane follow the cable).
    """

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
    a trunk carries one circuit at a time.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: Name = Field(alias="from", description="the switch the light leaves (on its egress port `egress`)")
    egress: int = Field(ge=1, description="egress port of `from`")
    to: Name = Field(description="the switch the light enters (on its ingress port `ingress`)")
    ingress: int = Field(ge=1, description="ingress port of `to`")
    loss_db: float = Field(0.0, ge=0, le=60, description="loss of the fibre and its connectors")

    @property
    def label(self) -> str:
        return f"{self.from_}:{self.egress} -> {self.to}:{self.ingress}"
