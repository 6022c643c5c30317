"""Where the job's fabric service listens, and the address each rank's host is told to reach it at.

A rank runs on a GPU host, not on the control host, so the service must listen on an address of the control host
that the GPU hosts reach, and tell each rank that address, never 127.0.0.1 (unless the rank's host is this very
machine, as in the twin on loopback). The inventory may name it (`controller_address`: this control host's address
on the lab network); otherwise it is found from the kernel's route to each host: the local address the packets to
that host leave from, which is the address that host sees them come from.
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARD = {4: "0.0.0.0", 6: "::"}  # noqa: S104 - several networks: listen on each, tell each host its own address


def service_addresses(hosts: dict[str, str], configured: str | None = None) -> tuple[str, dict[str, str]]:
    """(the address to listen on, host -> the address that host reaches the service at), from each host's address
    as this machine reaches it (its SSH host). One local address for every host: listen on it alone; several (the
    hosts on different networks): listen on all, and tell each host its own.
    """
    if configured:
        return configured, dict.fromkeys(hosts, configured)
    advertised = {host: source_address(address) for host, address in hosts.items()}
    distinct = set(advertised.values())
    if len(distinct) == 1:
        return distinct.pop(), advertised
    versions = {ipaddress.ip_address(a).version for a in distinct}
    return WILDCARD[6 if 6 in versions else 4], advertised


def source_address(address: str) -> str:
    """The local address this machine's packets to `address` leave from (the kernel's route; nothing is sent)."""
    try:
        info = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)[0]
    except (OSError, UnicodeError) as exc:
        from testbed.contracts.errors import UserError

        raise UserError(
            f"cannot find this machine's address towards {address} ({exc}): the job's fabric service must listen "
            "where the ranks' hosts reach it\n  try: set controller_address in the inventory to this control "
            "host's address on the lab network"
        ) from None
    family, _, _, _, sockaddr = info
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)  # a UDP "connect" only picks the route
        local: str = probe.getsockname()[0]
        return local
