"""Light paths through the twin's switches, read from the fibre map, the trunks and the engines' live state.

A fibre cables one host port to one switch: the host transmits into the switch's ingress port and
receives from its egress port. A trunk is a switch-to-switch fibre, one direction: light leaving switch S
on egress port e enters switch T on ingress port i. Light goes from host A port p to host B port q when
it can be followed from A:p's ingress through a circuit to an egress, and from there either to B:q's
receiver (B:q's egress on that switch) or over a trunk into the next switch's ingress, and so on:

- OCS (emulators/scpi/ocs.py): the engine holds ingress -> egress, neither port is moving (a moving
  port is dark), both are enabled and not failed.
- Photonic chip (emulators/mesh/chip.py, inputs 1..N, outputs N+1..2N): |T[o][i]|^2 >= 0.5, i.e. the
  chip carries most of input i's light to output o (a half-set or drifted cell does not count).

and the path's loss (each OCS's insertion loss, each chip's -10 log10 |T[o][i]|^2, each trunk's loss_db)
stays within the budget: A:p's launch power minus the loss at or above B:q's receiver sensitivity.

Checks read engine state only (no I/O) and follow the light hop by hop (a few dictionary look-ups per
switch), so they are cheap enough to run every few milliseconds on the twin's loop.

`couple_trunk_light` also makes each switch's power monitor see light arriving over a trunk, so an OCS's
PMON on an egress reads the whole path's light (see its docstring for what is not modelled).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

MESH_THRESHOLD = 0.5  # fraction of an input's light that must reach the output for a mesh path
DEFAULT_LAUNCH_DBM = 0.0
DEFAULT_RX_SENSITIVITY_DBM = -20.0
DARK_DBM = -99.0  # at or below: no light (the engines report -99.99 for a dark port)


def _power(chip: Any, now: float) -> Any:
    """The fraction of each input's light at each output of a photonic mesh, [output, input], 0-based. numpy is
    imported here, not with the module: a twin of hosts and circuit switches alone never needs it, and its import
    is CPU that the start of a run shares with Ray's (docs/tuning.md, "A run's start on two cores").
    """
    import numpy as np

    return np.abs(chip.transfer(now)) ** 2


@dataclass(frozen=True)
class FibreEnd:
    host: str
    port: str
    switch: str
    ingress: int
    egress: int
    launch_power_dbm: float = DEFAULT_LAUNCH_DBM
    rx_sensitivity_dbm: float = DEFAULT_RX_SENSITIVITY_DBM

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TrunkFibre:
    """Light leaving switch `src` on egress `egress` enters switch `dst` on ingress `ingress`."""

    src: str
    egress: int
    dst: str
    ingress: int
    loss_db: float = 0.0

    @property
    def label(self) -> str:
        return f"trunk {self.src}:{self.egress}->{self.dst}:{self.ingress}"


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
                launch_power_dbm=_number(item.get("launch_power_dbm", DEFAULT_LAUNCH_DBM)),
                rx_sensitivity_dbm=_number(item.get("rx_sensitivity_dbm", DEFAULT_RX_SENSITIVITY_DBM)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"fibres[{n}] {dict(item)!r}: needs host, port, switch, ingress, egress "
                f"(and optionally launch_power_dbm, rx_sensitivity_dbm) ({exc})"
            ) from exc
        if (end.host, end.port) in out:
            raise ValueError(f"fibres[{n}]: {end.label} is cabled twice")
        out[(end.host, end.port)] = end
    return out


def parse_trunks(raw: Any) -> dict[tuple[str, int], TrunkFibre]:
    """The spec's trunk list ({from, egress, to, ingress, loss_db}) -> {(from switch, egress): TrunkFibre};
    ValueError naming the bad entry.
    """
    if not isinstance(raw, list):
        raise ValueError(f"trunks must be a list of objects, got {type(raw).__name__}")
    out: dict[tuple[str, int], TrunkFibre] = {}
    into: set[tuple[str, int]] = set()
    for n, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"trunks[{n}] must be an object, got {item!r}")
        try:
            trunk = TrunkFibre(
                src=_text(item["from"]),
                egress=_port(item["egress"]),
                dst=_text(item["to"]),
                ingress=_port(item["ingress"]),
                loss_db=_number(item.get("loss_db", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"trunks[{n}] {dict(item)!r}: needs from, egress, to, ingress (and optionally loss_db) ({exc})"
            ) from exc
        if trunk.loss_db < 0:
            raise ValueError(f"trunks[{n}]: loss_db must be >= 0, got {trunk.loss_db}")
        if (trunk.src, trunk.egress) in out:
            raise ValueError(f"trunks[{n}]: {trunk.src} egress {trunk.egress} carries two trunks")
        if (trunk.dst, trunk.ingress) in into:
            raise ValueError(f"trunks[{n}]: {trunk.dst} ingress {trunk.ingress} receives two trunks")
        out[(trunk.src, trunk.egress)] = trunk
        into.add((trunk.dst, trunk.ingress))
    return out


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a port number >= 1, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


class LightPaths:
    """Which host ports the twin's switches currently connect, in each direction."""

    def __init__(
        self,
        fibres: Any,
        devices: Mapping[str, Any],
        *,
        trunks: Any = None,
        mesh_threshold: float = MESH_THRESHOLD,
    ):
        self.fibres = parse_fibres(fibres)
        self.trunks = parse_trunks(trunks or [])
        self.devices = devices
        self.mesh_threshold = mesh_threshold
        # (switch, egress) -> the host port receiving from it, to say where stray light goes
        self.receivers = {(f.switch, f.egress): f for f in self.fibres.values()}

    def fibre(self, host: str, port: str) -> FibreEnd:
        end = self.fibres.get((host, port))
        if end is None:
            known = ", ".join(sorted(f.label for f in self.fibres.values())) or "none"
            raise ValueError(f"{host}:{port} is not in the twin's fibre map (cabled host ports: {known})")
        return end

    def fibre_map(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.fibres.values()]

    def trunk_map(self) -> list[dict[str, Any]]:
        return [
            {"from": t.src, "egress": t.egress, "to": t.dst, "ingress": t.ingress, "loss_db": t.loss_db}
            for t in self.trunks.values()
        ]

    def hop(self, src: FibreEnd, dst: FibreEnd, now: float, cache: dict | None = None) -> tuple[bool, str]:
        """Does light leaving src's transmitter reach dst's receiver, through one switch or several, within
        the loss budget? (lit, why)
        """
        switch, ingress = src.switch, src.ingress
        loss = 0.0
        steps: list[str] = []
        crossed: set[TrunkFibre] = set()
        while True:
            want = dst.egress if switch == dst.switch else None
            egress, why, db = self._cross(switch, ingress, want, dst, now, cache)
            if egress is None:
                return False, (f"after {', '.join(steps)}: {why}" if steps else why)
            steps.append(why)
            loss += db
            if egress == want:
                break
            trunk = self.trunks[(switch, egress)]  # _cross returns only the wanted egress or a trunk's
            if trunk in crossed:
                return False, f"light from {src.label} loops: {', '.join(steps)}"
            crossed.add(trunk)
            steps.append(trunk.label)
            loss += trunk.loss_db
            switch, ingress = trunk.dst, trunk.ingress
        budget = src.launch_power_dbm - dst.rx_sensitivity_dbm
        if loss > budget + 1e-9:
            return False, (
                f"{', '.join(steps)} loses {loss:.2f} dB, over the loss budget of {budget:.2f} dB "
                f"({src.label} launches {src.launch_power_dbm:g} dBm, {dst.label} receives down to "
                f"{dst.rx_sensitivity_dbm:g} dBm)"
            )
        if crossed:
            return True, f"{', '.join(steps)} ({loss:.2f} dB of {budget:.2f} dB)"
        return True, steps[0]

    def landing(self, src: FibreEnd, now: float, cache: dict | None = None) -> tuple[FibreEnd | None, str]:
        """Whose receiver the light src transmits reaches now, if any: (that host port, why) or (None, why).
        The light is followed where the switches send it (an OCS's circuit, the output a chip carries most of
        an input to, trunks on to the next switch), then `hop` checks the whole way (ports enabled and still,
        the chip's share, the loss budget), so the answer is hop's for the one receiver the light can reach.
        """
        switch, ingress = src.switch, src.ingress
        crossed: set[TrunkFibre] = set()
        while True:
            device: Any = self.devices.get(switch)  # an adapter of its kind, or None
            kind = getattr(device, "kind", None)
            if kind == "ocs":
                egress = device.engine.conn.get(ingress)
                if egress is None:
                    return None, f"{switch} holds no circuit from {ingress}"
            elif kind == "photonic_mesh":
                chip = device.chip
                if not 1 <= ingress <= chip.n:
                    return None, f"{switch}: {ingress} is not an input (1..{chip.n})"
                power = None if cache is None else cache.get(switch)
                if power is None:
                    power = _power(chip, now)
                    if cache is not None:
                        cache[switch] = power
                egress = chip.n + 1 + int(power[:, ingress - 1].argmax())
            elif device is None:
                return None, f"switch {switch!r} is not emulated in this twin"
            else:
                return None, f"device {switch!r} ({kind}) is not a switch"
            receiver = self.receivers.get((switch, egress))
            if receiver is not None:
                lit, why = self.hop(src, receiver, now, cache)
                return (receiver if lit else None), why
            trunk = self.trunks.get((switch, egress))
            if trunk is None:
                return None, f"{switch} sends {src.label}'s light out of {egress}, where no fibre is"
            if trunk in crossed:
                return None, f"light from {src.label} loops"
            crossed.add(trunk)
            switch, ingress = trunk.dst, trunk.ingress

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

    # ---- one switch -----------------------------------------------------------------------------------

    def _cross(
        self, name: str, i: int, want: int | None, dst: FibreEnd, now: float, cache: dict | None
    ) -> tuple[int | None, str, float]:
        """Light entering switch `name` on ingress i: (the egress it leaves on, what it crossed, loss dB), or
        (None, why it stops here, 0). It goes on only to `want` (dst's egress, on dst's switch) or a trunk.
        """
        device: Any = self.devices.get(name)  # an adapter of its kind, or None
        kind = getattr(device, "kind", None)
        if kind == "ocs":
            engine = device.engine
            held = engine.conn.get(i)
            if held is None:
                return None, f"{name} holds no circuit {i}->{want}" if want else f"{name} holds no circuit from {i}", 0
            if held != want and (name, held) not in self.trunks:
                if want is not None:
                    return None, f"{name} holds no circuit {i}->{want} (it holds {i}->{held})", 0
                return None, self._astray(name, f"holds {i}->{held}", held, dst), 0
            ok, why = _ocs_ports(engine, i, held, now)
            return (held, why, engine.spec.insertion_loss_db) if ok else (None, why, 0)
        if kind == "photonic_mesh":
            return self._mesh_cross(device.chip, name, i, want, dst, now, cache)
        if device is None:
            return None, f"switch {name!r} is not emulated in this twin", 0
        return None, f"device {name!r} ({kind}) is not a switch", 0

    def _astray(self, name: str, what: str, egress: int, dst: FibreEnd) -> str:
        """Why light that left `name` on `egress` (neither a trunk nor dst's receiver) is lost."""
        receiver = self.receivers.get((name, egress))
        lands = f"{receiver.label}'s receiver" if receiver else "no fibre"
        return f"{name} {what}, which leads to {lands}, not on toward {dst.label} on {dst.switch}"

    def _mesh_cross(
        self, chip: Any, name: str, i: int, want: int | None, dst: FibreEnd, now: float, cache: dict | None
    ) -> tuple[int | None, str, float]:
        n = chip.n
        if not 1 <= i <= n or (want is not None and not n < want <= 2 * n):
            return None, f"{name}: {i} -> {want} is not input (1..{n}) -> output ({n + 1}..{2 * n})", 0
        power = None if cache is None else cache.get(name)
        if power is None:
            power = _power(chip, now)  # [output, input], 0-based
            if cache is not None:
                cache[name] = power
        if want is not None and power[want - n - 1, i - 1] >= self.mesh_threshold:
            out = want
        else:
            out = n + 1 + int(power[:, i - 1].argmax())
        carried = float(power[out - n - 1, i - 1])
        if carried < self.mesh_threshold:
            below = f"(< {self.mesh_threshold:g})"
            if want is not None:
                carried = float(power[want - n - 1, i - 1])
                return None, f"{name} carries {carried:.2f} of input {i} to output {want} {below}", 0
            return None, f"{name} carries at most {carried:.2f} of input {i} to any output {below}", 0
        if out != want and (name, out) not in self.trunks:
            if want is not None:
                return None, f"{name} carries input {i} to output {out}, not {want}", 0
            return None, self._astray(name, f"carries {i}->{out}", out, dst), 0
        return out, f"{name} {i}->{out} carries {carried:.2f}", -10 * math.log10(carried)


def _ocs_ports(engine: Any, i: int, e: int, now: float) -> tuple[bool, str]:
    name = engine.spec.name
    for p in (i, e):
        state = engine.port_state(p)
        if state != "E":
            return False, f"{name} port {p} is {'failed' if state == 'F' else 'disabled'}"
        if engine.is_moving(p, now):
            return False, f"{name} port {p} is moving"
    return True, f"{name} {i}->{e}"


def couple_trunk_light(trunks: Mapping[tuple[str, int], TrunkFibre], devices: Mapping[str, Any]) -> None:
    """Let light cross the trunks for the switches' power monitors: each trunk's downstream switch reads the
    light on its ingress live from the upstream switch's egress, less the trunk's loss (through the
    engines' `input_feeds`). An OCS's PMON on an egress then reads the launch power less every loss on the
    way, whichever switch the light entered. The feeds are evaluated when a port is read (no polling); a
    loop of circuits through trunks reads dark rather than recursing. Not modelled: a chip's photodiodes
    read the light arriving over a trunk, but the light a chip sends into a trunk is its noiseless output
    (no photodiode noise is drawn for it).
    """
    evaluating: set[TrunkFibre] = set()
    for trunk in trunks.values():
        read = _egress_reader(devices.get(trunk.src), trunk.egress)
        feeds = _input_feeds(devices.get(trunk.dst))
        if read is None or feeds is None:
            continue

        def feed(now: float, trunk: TrunkFibre = trunk, read: Callable[[float], float] = read) -> float | None:
            if trunk in evaluating:
                return None
            evaluating.add(trunk)
            try:
                dbm = read(now)
            finally:
                evaluating.discard(trunk)
            return None if dbm <= DARK_DBM else dbm - trunk.loss_db

        feeds[trunk.ingress] = feed


def _egress_reader(device: Any, egress: int) -> Callable[[float], float] | None:
    kind = getattr(device, "kind", None)
    if kind == "ocs":
        return lambda now: device.engine.power_dbm(egress, now)
    if kind == "photonic_mesh":
        chip = device.chip

        def read(now: float) -> float:
            mw = float(chip.output_power_mw(now, noise=False)[egress - chip.n - 1])
            return 10 * math.log10(mw) if mw > 0 else DARK_DBM - 1

        return read
    return None


def _input_feeds(device: Any) -> dict | None:
    kind = getattr(device, "kind", None)
    if kind == "ocs":
        return device.engine.input_feeds
    if kind == "photonic_mesh":
        return device.chip.input_feeds
    return None
