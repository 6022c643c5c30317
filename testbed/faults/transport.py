"""Faults on the connection between the framework and a device (transport.*), applied by the twin's fault
proxy, a Toxiproxy-compatible proxy in front of each device's TCP endpoint (docs/protocols.md §5). They exist
only in an emulated run: on a lab, break the network with your own tools (tc netem on the control host).

Names and units of the toxics' attributes are Toxiproxy's; TOXICS below is the framework's copy of the proxy's
table (emulators/proxy/toxics.py SCHEMA; a test keeps them equal), so a playbook is validated without the
emulators.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from testbed.faults.base import DeadFault, FaultEnv, FaultFailed, HealLab, Injected, twin_control

# toxic type -> its attributes (latency, jitter, delay, timeout in ms; slicer delay in us; rate in KB/s;
# sizes and bytes in bytes). An attribute left out is 0, as in Toxiproxy.
TOXICS: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
DOWN = "down"  # not a toxic: the proxy refuses new connections and cuts the open ones


@dataclass(frozen=True)
class ConnectionTarget:
    """The connection a transport fault breaks: the device behind the proxy, the toxic's name there (unique
    in the run), which direction, and the toxic's attributes."""

    device: str
    toxic: str
    stream: str = "downstream"
    attributes: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class TransportFault:
    name: str
    toxic: str  # a key of TOXICS, or DOWN
    target: str = "connection"
    lab_support: str | None = (
        "the twin's fault proxy applies it; on a lab, break the network with your own tools (tc netem on the "
        "control host)"
    )

    @property
    def attributes(self) -> tuple[str, ...]:
        return TOXICS.get(self.toxic, ())

    def inject(self, env: FaultEnv, target: ConnectionTarget) -> Injected:
        if env.twin is None:
            raise FaultFailed(f"{self.name} is applied by the twin's fault proxy; run with --emulate")
        t0 = time.monotonic_ns()
        try:
            if self.toxic == DOWN:
                env.twin.call(target.device, "proxy.set_enabled", enabled=False)
            else:
                env.twin.call(
                    target.device,
                    "proxy.add_toxic",
                    name=target.toxic,
                    type=self.toxic,
                    stream=target.stream,
                    attributes=dict(target.attributes),
                )
        except Exception as exc:  # the twin refused (no proxy, bad attribute) or is gone: nothing was applied
            raise FaultFailed(f"the twin's fault proxy refused {self.name}: {exc}") from None
        return Injected((t0 + time.monotonic_ns()) // 2)  # within the call that applied it

    def heal(self, env: FaultEnv, target: ConnectionTarget) -> None:
        try:
            if self.toxic == DOWN:
                env.twin.call(target.device, "proxy.set_enabled", enabled=True)
            else:
                env.twin.call(target.device, "proxy.remove_toxic", name=target.toxic)
        except Exception as exc:
            raise FaultFailed(f"could not heal {self.name} on {target.device}: {exc}") from None

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        device = fault.data.get("device") or fault.device
        twin_control(lab, fault).call(device, "proxy.reset")
        return f"twin control proxy.reset on {device}"


TRANSPORT_FAULTS = tuple(TransportFault(f"transport.{toxic}", toxic) for toxic in (*TOXICS, DOWN))
