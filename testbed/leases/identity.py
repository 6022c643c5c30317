"""A device's identity, as leases and device locks key it: the device, not the words that reach it.

Two inventories may name one switch differently: `admin@ocs1:3082` and `alice@ocs1:3082` (two users, their own
accounts on it), `TCPIP0::127.0.0.1::5025::SOCKET` and `TCPIP::localhost::5025::SOCKET`, `OCS1.lab.` and
`ocs1.lab`, `/dev/serial/by-id/usb-...` and the `/dev/ttyUSB0` it points at. Each is one device, so each gets one
identity: the transport's endpoint (testbed.config.transports.Endpoint: no login user), its host lowercased,
without a trailing dot and resolved to an address (an IPv4 one where the name has both). Every spelling of this
machine (127.0.0.0/8, ::1, ::ffff:127.0.0.1, localhost, 0.0.0.0, ::) is one host, 127.0.0.1: a switch reached as
`::1` by one run and as `127.0.0.1` by another is one switch. Where a device says who it
is when identified (its vendor, model and serial number), that is an identity too (`told_identity`): a switch
reached over NETCONF by one run and over TL1 by another is still one switch (docs/leases.md).
"""

from __future__ import annotations

import functools
import ipaddress
import socket


def device_identity(transport) -> str:
    """The identity of the device a transport config (testbed.config.transports.TransportConfig) reaches."""
    scheme, host, where = transport.endpoint()
    if host is None:
        return f"{scheme}:{where}"
    return f"{scheme}://{canonical_host(host)}:{where}"


def told_identity(identify: dict) -> str | None:
    """The identity a device told at identify (its family's `identify` result), or None when it told no serial
    number (an emulated or anonymous device).
    """
    serial = str(identify.get("serial") or "").strip()
    if not serial or serial.lower() in ("0", "unknown", "n/a", "none"):
        return None
    vendor = str(identify.get("vendor") or "").strip().lower()
    model = str(identify.get("model") or "").strip().lower()
    return f"serial:{vendor}:{model}:{serial}"


@functools.lru_cache(maxsize=4096)
def canonical_host(name: str) -> str:
    """One spelling per host: an address as Python writes it, or the address the name resolves to (IPv4 first);
    a name that does not resolve is kept, lowercased and without its trailing dot.
    """
    host = name.strip().strip("[]").rstrip(".").lower()
    try:
        return _address_text(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return host
    addresses = sorted({ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}, key=_ipv4_first)
    return _address_text(addresses[0]) if addresses else host


LOOPBACK = "127.0.0.1"


def _address_text(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    address = getattr(address, "ipv4_mapped", None) or address
    # A connection to any of these reaches this machine: one host, however it was written.
    if address.is_loopback or address.is_unspecified:
        return LOOPBACK
    return str(address)


def _ipv4_first(address) -> tuple[int, bytes]:
    return (address.version, address.packed)
