"""What every NETCONF session of one switch shares: the server's options, and the server itself as the reads and
writes of `running` see it (a Switch; NetconfServer is one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from emulators.netconf.protocol import BASE_10, BASE_11, MOTION_NS, OPSW_NS

PAIR_REVISION = "2017-08-04"  # from this revision on the list is `pair`, before it `pairs` (ONOS PolatisUtility)
MOTION_REVISION = "2025-01-01"


@dataclass(frozen=True)
class NetconfOptions:
    """Front-end options where the sources are silent or switches differ."""

    revision: str = "2018-03-22"  # the optical-switch module revision in the hello (ONOS's generated model)
    base11: bool = True  # advertise base:1.1 (chunked framing); False: a base:1.0-only server
    accept_unqualified_operation: bool = True  # ONOS sends operation="delete" without the NETCONF namespace
    motion: bool = True  # serve and advertise the switch-motion module (wait_settled without it: a fixed wait)
    max_message: int = 4 * 1024 * 1024  # bytes of one incoming message
    message_timeout_s: float = 30.0  # a message begun must end within this
    hello_timeout_s: float = 30.0  # the client's hello must arrive within this
    transcript: bool = False  # keep each session's (rpc, reply) messages in its record (tests read them)

    @property
    def list_name(self) -> str:
        """The cross-connect list's name at this revision: `pairs` before 2017-08-04, `pair` from then on."""
        return "pairs" if self.revision < PAIR_REVISION else "pair"

    @property
    def capabilities(self) -> list[str]:
        """The capabilities the server's hello advertises."""
        caps = [BASE_10] + ([BASE_11] if self.base11 else [])
        caps += [
            "urn:ietf:params:netconf:capability:writable-running:1.0",
            "urn:ietf:params:netconf:capability:rollback-on-error:1.0",
            f"{OPSW_NS}?module=optical-switch&revision={self.revision}",
        ]
        if self.motion:
            caps.append(f"{MOTION_NS}?module=testbed-switch-motion&revision={MOTION_REVISION}")
        return caps


class Switch(Protocol):
    """The switch a session works on: its model, options and clock, and which session holds the lock of `running`."""

    engine: Any
    options: NetconfOptions
    clock: Callable[[], float]
    lock_owner: int | None
