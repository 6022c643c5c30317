"""The panel's driver: the CircuitSwitch capability over its line protocol, on any line transport."""

from __future__ import annotations

import time

from drivers.capabilities import Identity
from drivers.errors import DeviceCommandError, DeviceProtocolError
from patchpanel.protocol import parse_circuits


class PanelDriver:
    def __init__(self, transport, device: str) -> None:
        self.transport = transport
        self.device = device

    def _ok(self, command: str) -> None:
        reply = self.transport.query(command)
        if reply != "OK":
            raise DeviceCommandError(
                f"the panel refused {command!r}: {reply}",
                device=self.device,
                address=self.transport.address,
                sent=command,
                received=reply,
                hint="check the ports against the panel's size",
            )

    def identify(self) -> Identity:
        reply = self.transport.query("*IDN?")
        parts = reply.split(",")
        if len(parts) != 4:
            raise DeviceProtocolError(
                "not an identity", device=self.device, address=self.transport.address, sent="*IDN?", received=reply
            )
        return Identity(*parts)

    def size(self) -> tuple[int, int]:
        n = int(self.transport.query("SIZE?"))
        return n, n

    def connect(self, pairs, *, check: bool = True) -> None:
        for i, e in pairs:
            self._ok(f"CONN {i},{e}")

    def disconnect(self, pairs, *, check: bool = True) -> None:
        for i, _ in pairs:
            self._ok(f"DISC {i}")

    def check_errors(self, after: str = "") -> None:
        pass  # every command is answered OK or ERR at once

    def disconnect_all(self) -> None:
        self.disconnect(sorted(self.connections().items()))

    def wait_settled(self) -> None:
        while self.transport.query("BUSY?") == "1":
            time.sleep(0.002)  # polling the arm, as the panel's manual asks

    def connections(self) -> dict[int, int]:
        return parse_circuits(self.transport.query("CONN?"))

    def port_power(self, ports) -> dict[int, float]:
        return {p: float(self.transport.query(f"POW? {p}")) for p in ports}

    def set_port_enabled(self, ports, enabled: bool) -> None:
        raise DeviceCommandError("a patch panel has no port enable", device=self.device, address=self.transport.address)

    def port_states(self, ports):
        return {p: "E" for p in ports}

    def close(self) -> None:
        self.transport.close()
