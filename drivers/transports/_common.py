"""Pieces shared by the line-oriented transports: framing, socket options and the hints in errors."""

from __future__ import annotations

import socket

from drivers.transports.base import TransportSettings


def no_delay(sock: object) -> None:
    """Turn off Nagle's algorithm on a TCP socket (neither pyvisa-py nor pyserial does).

    SCPI sends a set-command (no reply) and then `:SYST:ERR?`: two small segments in a row. With
    Nagle the second waits for the ACK of the first, which the device delays by up to 40 ms because it
    has nothing to send back: every checked write would cost ~40 ms more than the device takes.
    """
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def strip_reply(raw: bytes, read_termination: str) -> str:
    """The reply without its terminator; a trailing CR goes too (Polatis answers "\\r\\n")."""
    term = read_termination.encode()
    if term and raw.endswith(term):
        raw = raw[: -len(term)]
    # Not "strict": a garbled byte must reach the driver's parser (a DeviceProtocolError naming the
    # reply), not die here as a UnicodeDecodeError nobody can act on.
    return raw.decode("utf-8", errors="backslashreplace").rstrip("\r")


def timeout_hint(settings: TransportSettings) -> str:
    return (
        "check that the device is powered and that the address / termination characters are right "
        f"(read_termination is {settings.read_termination!r}, write_termination is "
        f"{settings.write_termination!r}); raise timeout_ms in the inventory if the device is slow "
        f"(now {settings.timeout_s * 1000:.0f} ms)"
    )


def dropped_hint() -> str:
    return (
        "the device closed or reset the connection (rebooted, or another client took its only "
        "session?); the next call reconnects, but the outcome of this command is unknown"
    )


def refused_hint(address: str) -> str:
    return (
        f"nothing accepted the connection to {address}: check that the device is on, the host and "
        "port in the inventory (Polatis SCPI listens on TCP 5025) and any firewall in between"
    )


def serial_open_hint(address: str) -> str:
    if "://" in address:
        return refused_hint(address) + " (pyserial URL forms: socket://host:port, rfc2217://host:port)"
    return (
        f"check that {address} exists and is not held by another program, that your user may open it "
        "(Linux: the 'dialout' group), or use a URL such as 'socket://host:port' for a terminal server"
    )
