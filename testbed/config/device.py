"""What every device of the inventory has (a driver, a transport, a node, read_only), and what every switch has
(ports: ingress 1..size, egress size+1..2*size). A device family's inventory model extends one of these
(testbed/families).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, Union
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from testbed.config.common import Strict
from testbed.config.switch_transports import NetconfTransport, Tl1Transport
from testbed.config.transports import SerialTransport, SshTransport, TransportConfig, VisaTransport
from testbed.contracts.registry import Registry

TRANSPORTS: Registry[type[TransportConfig]] = Registry(
    "transport type", "testbed.transports", lambda model: typing.get_args(model.model_fields["type"].annotation)[0]
)
for _model in (VisaTransport, SerialTransport, SshTransport, Tl1Transport, NetconfTransport):
    TRANSPORTS.register(_model, builtin=True)

if TYPE_CHECKING:
    Transport = TransportConfig  # every transport model is one; the union below is built at run time
else:
    # The transport union, from every registered transport type (another package's too).
    Transport = Annotated[Union[tuple(TRANSPORTS)], Field(discriminator="type")]  # noqa: UP007 (built at run time)


class FaultProxyConfig(Strict):
    """The lab's Toxiproxy (Shopify's) in front of this device's TCP port: where its HTTP API is and the
    proxy's name there. The device's own transport address is then the proxy's listen address, as the lab wired
    it. A lab run applies the transport.* faults on this device through that API (docs/faults.md).
    """

    api: str = Field(description="the Toxiproxy HTTP API: http://HOST:PORT (Toxiproxy listens on 8474 by default)")
    proxy: str = Field(min_length=1, description="the name of the proxy in front of this device on that server")
    timeout_ms: int = Field(5000, gt=0, le=600_000, description="per API request")

    @field_validator("api")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        parts = urlsplit(value)
        if parts.scheme.lower() not in ("http", "https") or "://" not in value:
            raise ValueError(
                f"{value!r}: the Toxiproxy API is an http:// or https:// address, e.g. http://127.0.0.1:8474"
            )
        try:
            parts.port  # noqa: B018 (parsing it is the check)
        except ValueError:
            raise ValueError(f"{value!r}: the port is not a number from 1 to 65535") from None
        if not parts.hostname or parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"{value!r} is not http[s]://HOST[:PORT][/PATH] (no user, no query)")
        return value


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
    fault_proxy: FaultProxyConfig | None = Field(
        None,
        description="the lab's Toxiproxy in front of this device's TCP port ({api: http://HOST:8474, proxy: NAME}): "
        "a lab run applies transport.* faults on the device through it; the transport's address is the proxy's",
    )
    description: str = ""


class SwitchConfig(DeviceConfig):
    """A device that holds circuits between its ports, so fibres may land on it (an OCS, a photonic chip)."""

    size: int = Field(ge=1, le=1024, description="ports per side: ingress 1..size, egress size+1..2*size")

    def port_allowed(self, port: int) -> bool:
        """Whether a run may touch this port (a family with reserved or allowed ports says more)."""
        return True

    def write_problems(self, name: str, ports, doing: str, who: str, verb: str) -> list[str]:
        """Why the inventory's interlocks refuse a write to `ports` of this switch (name: its name): read-only,
        or ports reserved or not allowed. `doing` completes "read-only in the inventory, but ..."; `who` and
        `verb` make "<who> would <verb> port(s) ..." (the planner's circuits, link.down's disable).
        """
        problems = []
        if self.read_only:
            problems.append(f"{name} is read-only in the inventory, but {doing}")
        bad = [p for p in ports if not self.port_allowed(p)]
        if bad:
            problems.append(
                f"{who} would {verb} port(s) {bad} of {name}, which the inventory reserves or does not allow "
                "(allowed_ports / reserved_ports)"
            )
        return problems

    def port_reserved(self, port: int) -> bool:
        """Whether the port is someone else's for good (reserved), not merely outside what a run may touch."""
        return False

    def pass_loss_db(self) -> float:
        """Loss of light crossing the switch once (ingress -> egress), as the planner budgets it."""
        return 0.0
