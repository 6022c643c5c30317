"""What every device of the inventory has (a driver, a transport, a node, read_only), and what every switch has
(ports: ingress 1..size, egress size+1..2*size). A device family's inventory model extends one of these
(testbed/families)."""

from __future__ import annotations

import typing
from typing import Annotated, Union

from pydantic import Field

from testbed.config.common import Strict
from testbed.config.switch_transports import NetconfTransport, Tl1Transport
from testbed.config.transports import SerialTransport, SshTransport, TransportConfig, VisaTransport
from testbed.registry import Registry

TRANSPORTS: Registry[type[TransportConfig]] = Registry(
    "transport type", "testbed.transports", lambda model: typing.get_args(model.model_fields["type"].annotation)[0]
)
for _model in (VisaTransport, SerialTransport, SshTransport, Tl1Transport, NetconfTransport):
    TRANSPORTS.register(_model, builtin=True)

# The transport union, from every registered transport type (another package's too).
Transport = Annotated[Union[tuple(TRANSPORTS)], Field(discriminator="type")]  # noqa: UP007 (built at run time)


class DeviceConfig(Strict):
    kind: str
    driver: str = Field(description="driver name, e.g. 'polatis-scpi'")
    transport: Transport
    node: str | None = Field(None, description="Ray node (control host) the device's actor must run on")
    read_only: bool = Field(False, description="never write to this device")
    isolated: bool = Field(
        False,
        description="serve the device from a process of its own, not its node's shared hub: a driver that "
        "might crash its process (a vendor library) then takes no other device down with it",
    )
    description: str = ""


class SwitchConfig(DeviceConfig):
    """A device that holds circuits between its ports, so fibres may land on it (an OCS, a photonic chip)."""

    size: int = Field(ge=1, le=1024, description="ports per side: ingress 1..size, egress size+1..2*size")

    def port_allowed(self, port: int) -> bool:
        """Whether a run may touch this port (a family with reserved or allowed ports says more)."""
        return True

    def port_reserved(self, port: int) -> bool:
        """Whether the port is someone else's for good (reserved), not merely outside what a run may touch."""
        return False

    def pass_loss_db(self) -> float:
        """Loss of light crossing the switch once (ingress -> egress), as the planner budgets it."""
        return 0.0
