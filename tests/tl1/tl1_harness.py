"""Shared by the TL1 tests: one twin with a switch per dialect, drivers on it, and the front ends driven in
process (no socket) for the fuzz tests.
"""

from __future__ import annotations

import re
import socket
import threading
import time

from drivers.tl1 import make_calient_tl1, make_polatis_tl1
from drivers.transports.tl1_settings import Tl1Settings
from emulators.frontends import TWIN_PASSWORD
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec, TwinSpec
from emulators.tl1.frontend import CalientTl1Frontend, PolatisTl1Frontend

SIZE = 16  # ingress 1..16, egress 17..32
SWITCHING_MS = 20
LIT = {3: 0.0, 4: -2.0}  # dBm arriving on these ingress ports
POLATIS, CALIENT = "pol1", "cal1"
FRONTENDS = {POLATIS: ["scpi", "tl1-polatis"], CALIENT: ["tl1-calient"]}
MAKERS = {POLATIS: make_polatis_tl1, CALIENT: make_calient_tl1}


def twin_spec() -> TwinSpec:
    return TwinSpec(
        devices=[
            OcsSpec(
                name=name,
                size=SIZE,
                switching_time_ms=SWITCHING_MS,
                jitter_ms=0,
                input_power_dbm=dict(LIT),
                frontends=frontends,
                user="admin",
            )
            for name, frontends in FRONTENDS.items()
        ]
    )


def settings_for(endpoint: str, *, password: str | None = TWIN_PASSWORD, timeout_s: float = 2.0, **kw) -> Tl1Settings:
    host, _, port = endpoint.rpartition(":")
    return Tl1Settings(host, int(port), user="admin", password=password, timeout_s=timeout_s, **kw)


# -- the front ends in process ---------------------------------------------------------------------------


class Local:
    """A front end on a fresh engine with one session, fed text directly; output is kept, decoded."""

    def __init__(self, dialect: str, size: int = 4, *, login: bool = True, circuits=()) -> None:
        spec = OcsSpec(name="sw", size=size, switching_time_ms=0, jitter_ms=0, circuits=list(circuits))
        self.engine = PolatisEngine(spec, clock=lambda: 0.0)
        cls = PolatisTl1Frontend if dialect == "polatis" else CalientTl1Frontend
        self.frontend = cls(self.engine, spec)
        self.out: list[str] = []
        self.session = self.frontend.new_session(
            lambda at, data: self.out.append(data.decode("ascii")), lambda data: self.out.append(data.decode())
        )
        self.now = 0.0
        if login:
            self.send(f"ACT-USER::admin:1::{TWIN_PASSWORD};")
            assert "COMPLD" in self.out[-1], self.out
            self.out.clear()

    def send(self, text: str | bytes) -> list[str]:
        """Feed `text`; the output blocks it caused."""
        before = len(self.out)
        self.now += 0.001
        self.session.receive(text if isinstance(text, bytes) else text.encode("latin-1"), self.now)
        return self.out[before:]

    def status(self, text: str) -> tuple[str, str]:
        """(COMPLD or DENY, the error code or "") of the one response to `text`."""
        (block,) = [b for b in self.send(text) if "\nM  " in b]
        m = re.search(r"M  \S+ (COMPLD|DENY)\r\n(?:   ([A-Z]{4})\r\n)?", block)
        assert m, block
        return m.group(1), m.group(2) or ""


# -- raw sockets -------------------------------------------------------------------------------------------


class Raw:
    """A plain TCP client: no project code on the client side. Reads TL1 blocks up to `;` (or `<`)."""

    def __init__(self, endpoint: str, timeout: float = 3.0) -> None:
        host, _, port = endpoint.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = b""

    def send(self, text: str | bytes) -> None:
        self.sock.sendall(text if isinstance(text, bytes) else text.encode("ascii"))

    def read_until(self, pattern: bytes, timeout: float = 3.0) -> bytes:
        """Everything up to and including the first match of regex `pattern`, which is then consumed."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(pattern, self.buf, re.S)):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {pattern!r} within {timeout} s; got {self.buf!r}"
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            assert chunk, f"connection closed; got {self.buf!r}"
            self.buf += chunk
        out, self.buf = self.buf[: m.end()], self.buf[m.end() :]
        return out

    def response(self, ctag: str, timeout: float = 3.0) -> bytes:
        """The response block with this CTAG (anything before it is dropped)."""
        block = self.read_until(rb"M  " + re.escape(ctag.encode()) + rb" (?:COMPLD|DENY)\r\n.*?;", timeout)
        return block[block.rfind(b"\r\n\n") :]

    def close(self) -> None:
        self.sock.close()


# -- a scripted TL1 peer -------------------------------------------------------------------------------------


def block(ctag: str, status: str = "COMPLD", lines: list[str] = (), sid: str = "fake") -> bytes:
    """A well-formed response, as a switch frames it."""
    body = "".join(f"   {line}\r\n" for line in lines)
    return f"\r\n\n   {sid} 24-05-01 12:00:00\r\nM  {ctag} {status}\r\n{body};".encode()


class ScriptedTl1:
    """Not a switch: a thread that logs anyone in and answers every other command with what
    `script(verb, ctag)` returns (bytes, or None to stay silent). For the driver's response parser.
    `hang_ups`: that many commands (other than logins) are answered by closing the connection.
    """

    def __init__(self, script, *, hang_ups: int = 0) -> None:
        self.script = script
        self.hang_ups = hang_ups
        self.commands: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while not self._stop:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b";" in buf:
                    text, buf = buf.split(b";", 1)
                    fields = text.decode("latin-1").strip().split(":")
                    verb, ctag = fields[0].upper(), (fields[3] if len(fields) > 3 else "0") or "0"
                    self.commands.append(text.decode("latin-1").strip())
                    if self.hang_ups and verb not in ("ACT-USER", "CANC-USER"):
                        self.hang_ups -= 1
                        return
                    reply = block(ctag) if verb in ("ACT-USER", "CANC-USER") else self.script(verb, ctag)
                    if reply is not None:
                        try:
                            conn.sendall(reply)
                        except OSError:
                            return

    def stop(self) -> None:
        self._stop = True
        self._listener.close()
