"""A TL1 session on a plain TCP socket: connection, login, logging in again, one unique CTAG per command.

What the switch sends is matched to the commands by CTAG in drivers/transports/tl1_responses.py: responses go
to their commands, autonomous messages are kept aside (`autonomous`, newest last), the rest is dropped (after
auditing it). A refused command raises `Tl1Denied` (drivers/transports/tl1_refusals.py).
Every byte sent and received is audited; the password of ACT-USER never is (the audit gets
`ACT-USER::<user>:<ctag>::***;`, testbed/results/redact.py's form).
"""

from __future__ import annotations

import re
import socket
import time

from drivers.audit import AuditSink, record
from drivers.errors import DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.transports.tl1_messages import Tl1Message, joined
from drivers.transports.tl1_refusals import HINTS, MEANINGS, Tl1Denied, accepted
from drivers.transports.tl1_responses import Outstanding, Tl1Responses
from drivers.transports.tl1_settings import Tl1Settings

MAX_ACKS = 10  # each in-progress acknowledgment extends the wait by the timeout, this many times at most
_UNSAFE = re.compile(r"[;:\r\n\"]")  # what a user name or password cannot carry in ACT-USER


class Tl1Transport:
    """One TL1 session with one switch. Connects and logs in on first use; after a lost connection the next
    command connects again. Raises drivers.errors.DeviceError subclasses only.

    `command()` sends and waits for the answer. `send()` and `wait()` / `collect()` split the two, so several
    commands can be in flight at once (TL1's CTAGs exist for that): the switch executes them in order and
    their moves overlap, where waiting for each COMPLD would add up every switching time.
    """

    def __init__(self, settings: Tl1Settings, device: str, audit: AuditSink | None = None, *, hints=None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address  # user@host:port, as the inventory and the device actor name it
        self._where = f"{settings.host}:{settings.port}"
        self.hints = {**HINTS, **(hints or {})}  # a driver's own words for some error codes
        self._responses = Tl1Responses()
        self.autonomous = self._responses.autonomous  # the switch's autonomous messages, newest last
        self.last_sent: str | None = None  # the last command, as audited: for the drivers' error messages
        self._audit = audit
        self._sock: socket.socket | None = None
        self._logged_in = False

    # -- the interface the drivers use ------------------------------------------------------------------

    def command(self, verb: str, aid: str = "", *blocks: str, tid: str = "") -> Tl1Message:
        """Send `VERB:tid:aid:<ctag>[:block...];` and return its COMPLD response (continuations joined).

        Raises Tl1Denied for DENY/PRTL, DeviceTimeout, DeviceConnectionError, DeviceProtocolError.
        A DENY PLNA (the switch logged the session out, e.g. after its idle timeout) logs in again and sends
        the command once more: PLNA means it was not carried out.
        """
        try:
            return self.wait(self.send(verb, aid, *blocks, tid=tid))
        except Tl1Denied as err:
            if err.code != "PLNA":
                raise
        self._login()
        return self.wait(self.send(verb, aid, *blocks, tid=tid))

    def send(self, verb: str, aid: str = "", *blocks: str, tid: str = "") -> str:
        """Send a command without waiting for its answer; returns its CTAG for wait() or collect()."""
        self._connect()
        return self._send(verb, aid, blocks, tid)

    def wait(self, ctag: str) -> Tl1Message:
        """The COMPLD response to the command sent with `ctag`; raises as command() does (without retrying)."""
        command = self._responses.waiting(ctag)
        if command is None:
            raise ValueError(f"no command with CTAG {ctag} is waiting for its answer")
        received: list[str] = []
        start = time.monotonic()
        while not command.done:
            # an acknowledgment says the switch is working on it: wait on, from then (a bounded number of times)
            since = max(start, command.acked_at) if command.acks <= MAX_ACKS else start
            self._read(since + self.settings.timeout_s, command, ctag, received)
        self._responses.forget(ctag)
        return self._result(command)

    def collect(self, ctags: list[str]) -> list[Tl1Message | Tl1Denied]:
        """The answers to commands sent with send(), in order: a Tl1Denied for each refused one. Any other
        error (no answer, the connection lost) is raised, and the outcome of every command still in flight
        is then unknown: they are forgotten.
        """
        results: list[Tl1Message | Tl1Denied] = []
        try:
            for ctag in ctags:
                try:
                    results.append(self.wait(ctag))
                except Tl1Denied as err:
                    results.append(err)
        except DeviceError:
            for ctag in ctags:
                self._responses.forget(ctag)
            raise
        return results

    def close(self) -> None:
        sock, logged_in = self._sock, self._logged_in
        self._forget()
        if sock is None:
            return
        if logged_in:
            try:  # log out politely; the answer is not waited for
                line = f"CANC-USER::{self.settings.user}:{self._responses.next_ctag()};"
                record(self._audit, self.device, self.address, "tx", line + "\r\n")
                sock.sendall((line + "\r\n").encode("ascii"))
            except OSError:
                pass
        sock.close()

    # -- connection and login ---------------------------------------------------------------------------

    def _connect(self) -> None:
        if self._sock is not None:
            return
        s = self.settings
        login = f"ACT-USER::{s.user}:<ctag>::<password>;"
        if s.password is None:
            raise self._error(
                DeviceConnectionError,
                f"no password to log in as {s.user!r} with, nothing was sent",
                hint=f"set the environment variable {s.password_env} to the password of user {s.user!r} on the switch"
                if s.password_env
                else f"give the driver the password of user {s.user!r} on the switch",
            )
        if _UNSAFE.search(s.user) or _UNSAFE.search(s.password):
            raise self._error(
                DeviceConnectionError,
                "the user name or password contains ; : \" or a line break, which TL1's ACT-USER cannot carry",
                hint="use a TL1 account whose name and password avoid those characters",
            )
        try:
            sock = socket.create_connection((s.host, s.port), timeout=s.timeout_s)
        except OSError as exc:
            raise self._error(
                DeviceConnectionError,
                f"cannot connect, nothing was sent: {exc}",
                sent=login,
                hint=f"nothing accepted the connection to {self._where}: check that the switch is on, the host "
                "and port in the inventory (Polatis TL1 listens on TCP 3082, Calient on 3083) and any firewall",
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one small command, then wait for its answer
        self._sock = sock
        self._login()

    def _error(self, cls: type[DeviceError], message: str, **kw) -> DeviceError:
        """A device error of this switch: `kw` says what was sent and received, and what to try."""
        return cls(message, device=self.device, address=self.address, **kw)

    def _login(self) -> None:
        s = self.settings
        self._logged_in = False
        try:
            self.wait(self._send("ACT-USER", s.user, ("", s.password or ""), "", masked=True))
            self._logged_in = True
        except Tl1Denied as err:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"the switch refused the login of user {s.user!r}: {err.code} ({MEANINGS.get(err.code, '?')})",
                sent=err.sent,
                received=err.received,
                hint="check the user name in the inventory and the password in "
                + (f"the environment variable {s.password_env}" if s.password_env else "the driver's settings"),
            ) from None
        except DeviceTimeout as err:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"no answer to the login within {s.timeout_s * 1000:.0f} ms",
                sent=err.sent,
                received=err.received,
                hint=f"is {self._where} a TL1 port (Polatis 3082, Calient 3083)? raise timeout_s if the switch is slow",
            ) from None
        except DeviceError:
            self._forget()
            raise

    # -- sending and receiving ------------------------------------------------------------------------

    def _send(self, verb: str, aid: str, blocks: tuple[str, ...], tid: str, *, masked: bool = False) -> str:
        assert self._sock is not None
        ctag = self._responses.next_ctag()
        head = f"{verb}:{tid}:{aid}:{ctag}"
        line = head + "".join(":" + b for b in blocks) + ";"
        # ACT-USER's last block is the password: the audit and every error message get *** instead
        shown = head + "".join(":" + b for b in blocks[:-1]) + ":***;" if masked else line
        self.last_sent = shown
        record(self._audit, self.device, self.address, "tx", shown + "\r\n")
        try:
            data = (line + "\r\n").encode("ascii")
        except UnicodeEncodeError:
            raise self._error(
                DeviceProtocolError,
                "a command may only hold ASCII characters, nothing was sent",
                sent=shown,
                hint="this is a bug in the driver that built the command",
            ) from None
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._forget()
            raise self._error(
                DeviceConnectionError,
                f"connection lost while sending: {exc}",
                sent=shown,
                hint="the switch closed or reset the connection; the next call reconnects and logs in again, but "
                "the outcome of this command is unknown",
            ) from exc
        self._responses.expect(ctag, shown)
        return ctag

    def _read(self, deadline: float, command: Outstanding, ctag: str, received: list[str]) -> None:
        """Read once (until `deadline`); file responses and acknowledgments under their commands."""
        data = self._recv(deadline, command, ctag, received)
        try:
            self._responses.feed(data.decode("utf-8", errors="backslashreplace"))
        except ValueError as exc:
            self._forget()
            raise self._error(
                DeviceProtocolError,
                f"the output is not TL1: {exc}",
                sent=command.shown,
                received="".join(received)[-2000:],
                hint=f"is {self._where} the switch's TL1 port?",
            ) from None

    def _recv(self, deadline: float, command: Outstanding, ctag: str, received: list[str]) -> bytes:
        assert self._sock is not None
        remaining = deadline - time.monotonic()
        fields = {"device": self.device, "address": self.address, "sent": command.shown}
        if remaining > 0:
            try:
                self._sock.settimeout(remaining)
                data = self._sock.recv(65536)
            except TimeoutError:
                data = None
            except OSError as exc:
                self._forget()
                raise DeviceConnectionError(
                    f"connection lost: {exc}",
                    received="".join(received) or None,
                    hint="the switch reset the connection; the next call reconnects, but the outcome of the "
                    "commands in flight is unknown",
                    **fields,
                ) from exc
            if data:
                record(self._audit, self.device, self.address, "rx", data)
                received.append(data.decode("utf-8", errors="backslashreplace"))
                return data
            if data == b"":
                self._forget()
                raise DeviceConnectionError(
                    "the switch closed the connection",
                    received="".join(received) or None,
                    hint="the switch ended the session (logged out, rebooted, or its idle timeout); the next call "
                    "reconnects, but the outcome of the commands in flight is unknown",
                    **fields,
                )
        self._responses.forget(ctag)
        raise DeviceTimeout(
            f"no response with CTAG {ctag} within {self.settings.timeout_s * 1000:.0f} ms",
            received="".join(received) or None,
            hint=f"check that {self._where} is the switch's TL1 port and the switch is responsive; raise "
            f"timeout_s in the inventory if it is slow (now {self.settings.timeout_s:g} s)",
            **fields,
        )

    def _forget(self) -> None:
        """Drop the connection and everything in flight on it."""
        self._logged_in = False
        sock, self._sock = self._sock, None
        self._responses.reset()
        if sock is not None:
            sock.close()

    def _result(self, command: Outstanding) -> Tl1Message:
        return accepted(
            joined(command.parts), sent=command.shown, device=self.device, address=self.address, hints=self.hints
        )
