"""host.straggle: the rank is stopped for a fraction of every period (a persistent straggler)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.faults.base import DeadFault, FaultEnv, HealLab, Injected, RankTarget, fire_in_twin, twin_control


@dataclass(frozen=True)
class HostStraggle:
    """The rank is stopped for `duty` of every `period_s` (StragglAR's persistent straggler)."""

    name: str = "host.straggle"
    target: str = "rank"
    lab_support: str | None = "a lab needs a duty-cycle agent on the host to make a straggler"
    marks_failed_on_lab: bool = False

    def describe(self, params: dict) -> str:
        return f", stopped {params.get('duty', 0.5):g} of every {params.get('period_s', 0.2) * 1000:g} ms"

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        # The playbook's duty is the fraction stopped; the twin's is the fraction running.
        duty, period_s = target.params.get("duty", 0.5), target.params.get("period_s", 0.2)
        args = {"pid": target.job.get("pid"), "duty": 1 - duty, "period_ms": period_s * 1000}
        return fire_in_twin(env.twin, self.name, target.host, "straggle", args)

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        env.twin.call(target.host, "stop_straggle", pid=target.job.get("pid"))

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        host = fault.data.get("host") or fault.device
        pid = (fault.job or {}).get("pid")
        args = {"pid": pid} if pid is not None else {}
        twin_control(lab, fault).call(host, "stop_straggle", **args)
        return f"twin control stop_straggle on {host} {args or ''}".rstrip()


STRAGGLE_FAULTS = (HostStraggle(),)
