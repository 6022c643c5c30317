"""host.power_off: the host loses power (its GPUs and processes with it), healed by powering it on."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.faults.base import DeadFault, FaultEnv, HealLab, Injected, RankTarget, fire_in_twin, twin_control


@dataclass(frozen=True)
class HostPowerOff:
    """The host loses power (its GPUs and processes with it); healed by powering it on."""

    name: str = "host.power_off"
    target: str = "rank"
    lab_support: str | None = "a lab needs a BMC to power a host off and on"
    marks_failed_on_lab: bool = False

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        return fire_in_twin(env.twin, self.name, target.host, "power_off", {})

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        env.twin.call(target.host, "power_on")

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        host = fault.data.get("host") or fault.device
        twin_control(lab, fault).call(host, "power_on")
        return f"twin control power_on on {host}"


POWER_FAULTS = (HostPowerOff(),)
