"""host.power_off: the host loses power (its GPUs and processes with it), healed by powering it on.

In the twin it is the emulated host's power_off control op, fired as a timed trigger. On a lab it goes through
the host's BMC, over Redfish (the inventory's `bmc:` of the host; drivers/redfish/bmc.py): ComputerSystem.Reset
ForceOff, PowerState read back until Off; the injection time is the midpoint of the reset request, marked by
the host's actor (gpu.power_off). Healing is Reset On and PowerState read back until On (gpu.power_on), and so
is `testbed heal` after a crash. A lab run whose plan may power off a host without a BMC in the inventory is
refused before it starts, naming the hosts (lab_refusal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.contracts.errors import UserError
from testbed.faults.base import (
    DeadFault,
    FaultEnv,
    FaultFailed,
    HealLab,
    Injected,
    RankTarget,
    dead_device,
    fire_in_twin,
)

BMC_EXAMPLE = "bmc: {address: https://HOST, user: USER, password_env: VARIABLE}"


def bmc_args(inventory: Any, host: str, kind: str = "host.power_off") -> dict[str, Any]:
    """The host's BMC settings as gpu.power_off / gpu.power_on take them (password included, from the
    environment); FaultFailed saying what to add or set when the inventory or the environment lacks them.
    """
    dev = inventory.devices.get(host) if inventory is not None else None
    bmc = getattr(dev, "bmc", None)
    if bmc is None:
        raise FaultFailed(
            f"{kind} on {host}: a lab powers a host off and on through its BMC, and the inventory gives {host} "
            f"none; add {BMC_EXAMPLE} to {host} in the inventory"
        )
    try:
        args: dict[str, Any] = bmc.call_args(host)
        return args
    except UserError as exc:
        raise FaultFailed(f"{kind} on {host}: {exc}") from None


@dataclass(frozen=True)
class HostPowerOff:
    """The host loses power (its GPUs and processes with it); healed by powering it on."""

    name: str = "host.power_off"
    target: str = "rank"
    lab_support: str | None = None  # through each host's BMC: lab_refusal says which hosts lack one
    marks_failed_on_lab: bool = False

    def lab_refusal(self, inventory: Any, hosts: list[str]) -> str | None:
        """Why a lab run that may power off any of `hosts` cannot (None: it can): a host without `bmc:` in the
        inventory, a BMC password variable not set, a CA file not there.
        """
        missing = [h for h in hosts if getattr(inventory.devices.get(h), "bmc", None) is None]
        if missing:
            these = ", ".join(missing)
            return (
                f"a lab powers a host off and on through its BMC, and the inventory gives {these} none; add "
                f"{BMC_EXAMPLE} to {'each of them' if len(missing) > 1 else these} (docs/inventory.md)"
            )
        problems = [p for h in hosts for p in inventory.devices[h].bmc.problems(h)]
        return "; ".join(problems) or None

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        """In the twin, power off at a timed trigger; on a lab, Reset ForceOff through the host's BMC."""
        if env.twin is not None:
            return fire_in_twin(env.twin, self.name, target.host, "power_off", {})
        result = env.call(target.host, "gpu.power_off", {"bmc": bmc_args(env.inventory, target.host)})
        return Injected(result.marks["fault_injected"][0], marked_by_device=True)

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        """Power the host on: the twin's power_on, or Reset On through its BMC."""
        if env.twin is not None:
            env.twin.call(target.host, "power_on")
            return
        env.call(target.host, "gpu.power_on", {"bmc": bmc_args(env.inventory, target.host)})

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Power the dead run's host on: through the twin if it outlived the run, else through the host's BMC."""
        host = dead_device(fault, fault.data.get("host"))
        if lab.control is not None:
            lab.control.call(host, "power_on")
            return f"twin control power_on on {host}"
        args = bmc_args(getattr(lab, "inventory", None), host)
        done = lab.call(host, "gpu.power_on", {"bmc": args}, "heal: power the host on through its BMC")
        if not done.get("changed"):
            return f"{host} was already on (its BMC at {args['address']} reads PowerState {done.get('power_state')})"
        return f"ComputerSystem.Reset On through the BMC of {host} ({args['address']}); PowerState reads On"


POWER_FAULTS = (HostPowerOff(),)
