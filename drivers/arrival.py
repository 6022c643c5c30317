"""When received bytes reached this machine, as opposed to when a thread got round to reading them.

A failover ends with a step line arriving over SSH. Between the network and the code that marks
first_step, paramiko's transport thread and then the reading thread must each be woken and scheduled; on a
busy control host (or the 2-core machine that runs an emulated lab) that takes from tens of microseconds to
several milliseconds. The measured time should not depend on it, so arrivals are timed as early as possible:

- `rx_stamped(sock)`: on Linux the kernel stamps every received TCP segment (SO_TIMESTAMPNS) and `recv`
  hands the stamp over, as ptp4l or a packet capture reads it. The socket remembers the stamp of its latest
  `recv`, converted to CLOCK_MONOTONIC (the clock every mark of a run is on). Stamping starts with the
  first stream that needs it: a connection that only runs commands keeps plain `recv` (about 5 % of a
  64-host health check's time otherwise).
- `Arrivals(channel)`: each piece of a channel's stdout, timed as paramiko's transport thread hands it to
  the channel: with the kernel's stamp of the packet it came in when there is one, else the time then.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time
from collections import deque

import paramiko

# Python's socket module does not name SO_TIMESTAMPNS; 35 is its value in Linux's asm-generic headers
# (x86 and arm). Elsewhere arrivals fall back to the transport thread's clock.
SO_TIMESTAMPNS = 35 if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64") else None
_TIMESPEC = struct.Struct("@ll")  # struct timespec: tv_sec, tv_nsec
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
STALE_NS = 1_000_000_000  # a stamp this old (or from the future) means the wall clock was stepped: unused


class RxStampedSocket(socket.socket):
    """A TCP socket whose `recv`, once `start_stamping` was called, keeps the kernel's receive stamp of what
    it returned (`last_rx_ns`, on CLOCK_MONOTONIC; None when the kernel gave none, e.g. for the first
    segments after stamping starts).
    """

    last_rx_ns: int | None = None
    stamping = False

    def start_stamping(self) -> bool:
        """Ask the kernel for receive stamps from now on (any thread); False if it refuses."""
        if not self.stamping and SO_TIMESTAMPNS is not None:  # None: rx_stamped made no such socket
            try:
                self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.stamping = True
            except OSError:
                pass  # no stamps: arrivals use the transport thread's clock
        return self.stamping

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self.stamping:
            return super().recv(bufsize, flags)
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY, flags)
        self.last_rx_ns = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                # The stamp is on CLOCK_REALTIME. Both clocks advance alike (NTP slews them together), so
                # their difference now converts it; a step of the wall clock would show as a stale stamp.
                now = time.monotonic_ns()
                rx = sec * 1_000_000_000 + nsec - (time.time_ns() - now)
                self.last_rx_ns = rx if 0 <= now - rx < STALE_NS else None
        return data


def rx_stamped(sock: socket.socket) -> socket.socket:
    """The same connection as a socket that keeps kernel receive stamps (the socket as it is where the
    kernel cannot stamp). `sock` must not be used afterwards.
    """
    if SO_TIMESTAMPNS is None:
        return sock
    timeout = sock.gettimeout()
    stamped = RxStampedSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    stamped.settimeout(timeout)  # a socket made from a descriptor starts with the default timeout
    return stamped


class Arrivals:
    """When each piece of a channel's stdout reached this machine: (end offset, monotonic ns) per piece,
    read back in order with `take` as the channel's bytes are read.
    """

    def __init__(self, channel: paramiko.Channel) -> None:
        self._pieces: deque[list[int]] = deque()  # [bytes left, ns]: appended by the transport thread
        self._latest = 0
        transport = channel.get_transport()
        sock = getattr(transport, "sock", None)
        if isinstance(sock, RxStampedSocket):
            sock.start_stamping()
        feed = channel.in_buffer.feed

        def stamped(data: bytes) -> None:
            # The transport thread has just read this packet: its socket's latest stamp is the packet's.
            rx = getattr(sock, "last_rx_ns", None)
            ns = rx if rx is not None else time.monotonic_ns()
            # A stream's bytes arrive in order, so their times never go back. A stamp can come out a little
            # earlier than the piece before it: each stamp's conversion to the monotonic clock reads two
            # clocks (some hundred ns of jitter), and a piece timed by this thread's clock (no stamp yet) is
            # late by the thread's wake-up. The later of the two is the honest bound.
            self._latest = max(self._latest, ns)
            self._pieces.append([len(data), self._latest])
            feed(data)

        channel.in_buffer.feed = stamped  # type: ignore[method-assign]  # on purpose: this channel's only

    def take(self, n: int) -> tuple[tuple[int, int], ...]:
        """The arrival of the next n bytes read from the channel: (end offset, ns) per piece."""
        out, done = [], 0
        while done < n and self._pieces:
            piece = self._pieces[0]
            used = min(piece[0], n - done)
            done += used
            out.append((done, piece[1]))
            piece[0] -= used
            if piece[0] == 0:
                self._pieces.popleft()
        return tuple(out)
