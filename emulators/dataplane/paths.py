"""Light paths through the twin's switches, read from the fibre map and the engines' live state.

A fibre cables one host port to one switch: the host transmits into the switch's ingress port and
receives from its egress port. Light goes from host A port p to host B port q when A:p's switch holds
a circuit from A:p's ingress to B:q's egress (both fibres on the same switch):

- OCS (emulators/polatis.py): the engine holds ingress -> egress, neither port is moving (a moving
  port is dark), both are enabled and not failed.
- Photonic chip (emulators/mesh/chip.py, inputs 1..N, outputs N+1..2N): |T[o][i]|^2 >= 0.5, i.e. the
  chip carries most of input i's light to output o (a half-set or drifted cell does not count).

Only paths through one switch are modelled: a fibre pair on two different switches is dark (with a
reason that says so). Checks read engine state only (no I/O), so they are cheap enough to run every
few milliseconds on the twin's loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MESH_THRESHOLD = 0.5  # fraction of an input's light that must reach the output for a mesh path


@dataclass(frozen=True)
class FibreEnd:
    host: str
    port: str
    switch: str
    ingress: int
    egress: int

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"


def parse_fibres(raw: Any) -> dict[tuple[str, str], FibreEnd]:
    """The spec's fibre list -> {(host, port): FibreEnd}; ValueError naming the bad entry."""
    if not isinstance(raw, list):
        raise ValueError(f"fibres must be a list of objects, got {type(raw).__name__}")
    out: dict[tuple[str, str], FibreEnd] = {}
    for n, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"fibres[{n}] must be an object, got {item!r}")
        try:
            end = FibreEnd(
                host=_text(item["host"]),
                port=_text(item["port"]),
                switch=_text(item["switch"]),
                ingress=_port(item["ingress"]),
                egress=_port(item["egress"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"fibres[{n}] {dict(item)!r}: needs host, port, switch, ingress, egress ({exc})") from exc
        if (end.host, end.port) in out:
            raise ValueError(f"fibres[{n}]: {end.label} is cabled twice")
        out[(end.host, end.port)] = end
    return out


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a port number >= 1, got {value!r}")
    return value


class LightPaths:
    """Which host ports the twin's switches currently connect, in each direction."""

    def __init__(self, fibres: Any, devices: Mapping[str, Any], *, mesh_threshold: float = MESH_THRESHOLD):
        self.fibres = parse_fibres(fibres)
        self.devices = devices
        self.mesh_threshold = mesh_threshold

    def fibre(self, host: str, port: str) -> FibreEnd:
        end = self.fibres.get((host, port))
        if end is None:
            known = ", ".join(sorted(f.label for f in self.fibres.values())) or "none"
            raise ValueError(f"{host}:{port} is not in the twin's fibre map (cabled host ports: {known})")
        return end

    def fibre_map(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.fibres.values()]

    def hop(self, src: FibreEnd, dst: FibreEnd, now: float, cache: dict | None = None) -> tuple[bool, str]:
        """Does light leaving src's transmitter reach dst's receiver? (lit, why)"""
        if src.switch != dst.switch:
            return False, (
                f"{src.label} is cabled to {src.switch} and {dst.label} to {dst.switch}: "
                "paths through several switches are not modelled"
            )
        device = self.devices.get(src.switch)
        kind = getattr(device, "kind", None)
        if kind == "ocs":
            return _ocs_hop(device.engine, src.ingress, dst.egress, now)
        if kind == "photonic_mesh":
            return self._mesh_hop(device.chip, src.switch, src.ingress, dst.egress, now, cache)
        if device is None:
            return False, f"switch {src.switch!r} is not emulated in this twin"
        return False, f"device {src.switch!r} ({kind}) is not a switch"

    def path(
        self, a_host: str, a_port: str, b_host: str, b_port: str, now: float, cache: dict | None = None
    ) -> dict[str, Any]:
        """Both directions between two host ports: a TCP connection needs both."""
        a, b = self.fibre(a_host, a_port), self.fibre(b_host, b_port)
        cache = {} if cache is None else cache
        fwd, fwd_why = self.hop(a, b, now, cache)
        back, back_why = self.hop(b, a, now, cache)
        return {
            "lit": fwd and back,
            "forward": {"lit": fwd, "why": fwd_why},
            "backward": {"lit": back, "why": back_why},
        }

    def _mesh_hop(self, chip: Any, name: str, i: int, e: int, now: float, cache: dict | None) -> tuple[bool, str]:
        n = chip.n
        if not 1 <= i <= n or not n < e <= 2 * n:
            return False, f"{name}: {i} -> {e} is not input (1..{n}) -> output ({n + 1}..{2 * n})"
        power = None if cache is None else cache.get(name)
        if power is None:
            power = np.abs(chip.transfer(now)) ** 2  # [output, input], 0-based
            if cache is not None:
                cache[name] = power
        carried = float(power[e - n - 1, i - 1])
        if carried >= self.mesh_threshold:
            return True, f"{name} {i}->{e} carries {carried:.2f}"
        return False, f"{name} carries {carried:.2f} of input {i} to output {e} (< {self.mesh_threshold:g})"


def _ocs_hop(engine: Any, i: int, e: int, now: float) -> tuple[bool, str]:
    name = engine.spec.name
    held = engine.conn.get(i)
    if held != e:
        return False, f"{name} holds no circuit {i}->{e}" + (f" (it holds {i}->{held})" if held else "")
    for p in (i, e):
        state = engine.port_state(p)
        if state != "E":
            return False, f"{name} port {p} is {'failed' if state == 'F' else 'disabled'}"
        if engine.is_moving(p, now):
            return False, f"{name} port {p} is moving"
    return True, f"{name} {i}->{e}"
