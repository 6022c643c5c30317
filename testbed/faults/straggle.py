"""host.straggle: the rank is stopped for a fraction of every period (a persistent straggler).

In the twin the emulated host runs the duty cycle itself (its `straggle` control op, fired as a timed trigger).
On a lab the host runs it: the gpuhost procedure gpu.straggle_start starts testbed-straggle there over SSH
(hostside/straggle_agent.py), and the moment its start line arrives, marked by the host's actor, is the
injection. It is healed by gpu.straggle_stop: the agent is sent SIGTERM (it continues the rank as it ends) and
the rank's process group SIGCONT once the agent is gone. `testbed heal` does the same from the dead run's
history, which names the agent (the result of gpu.straggle_start) and the rank (docs/faults.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from testbed.faults.base import (
    DeadFault,
    FaultEnv,
    FaultFailed,
    HealLab,
    Injected,
    RankTarget,
    dead_device,
    fire_in_twin,
    twin_control,
)

START, STOP = "gpu.straggle_start", "gpu.straggle_stop"

# The agents this process started and has not stopped yet: (host, rank pid) -> agent pid. Heal passes it on so
# its result says what became of that agent; without it (another process injected) the host's own list of
# agents is enough.
_agents: dict[tuple[str, int], int] = {}
_agents_lock = threading.Lock()


@dataclass(frozen=True)
class HostStraggle:
    """The rank is stopped for `duty` of every `period_s` (StragglAR's persistent straggler)."""

    name: str = "host.straggle"
    slows_only: bool = True  # the rank runs on, slower: nothing fails (testbed.faults.base.fails_a_rank)
    target: str = "rank"
    lab_support: str | None = None  # a duty-cycle agent on the host (testbed-straggle, installed with testbed)
    marks_failed_on_lab: bool = False

    def describe(self, params: dict[str, Any]) -> str:
        """The duty cycle, as `testbed plan` shows it after the kind."""
        return f", stopped {params.get('duty', 0.5):g} of every {params.get('period_s', 0.2) * 1000:g} ms"

    def inject(self, env: FaultEnv, target: RankTarget) -> Injected:
        """In the twin, the emulated host's duty cycle at a timed trigger; on a lab, the agent's start on the host."""
        duty, period_s = target.params.get("duty", 0.5), target.params.get("period_s", 0.2)
        if env.twin is not None:
            # The playbook's duty is the fraction stopped; the twin's is the fraction running.
            args = {"pid": target.job.get("pid"), "duty": 1 - duty, "period_ms": period_s * 1000}
            return fire_in_twin(env.twin, self.name, target.host, "straggle", args)
        result = env.call(target.host, START, {"job": target.job, "duty": duty, "period_ms": period_s * 1000})
        with _agents_lock:
            _agents[(target.host, int(target.job["pid"]))] = int(result.value["agent"])
        return Injected(result.marks["fault_injected"][0], marked_by_device=True)

    def heal(self, env: FaultEnv, target: RankTarget) -> None:
        """Stop the duty cycle (the twin's, or the agent this process started) and continue the rank."""
        if env.twin is not None:
            env.twin.call(target.host, "stop_straggle", pid=target.job.get("pid"))
            return
        with _agents_lock:
            agent = _agents.pop((target.host, int(target.job["pid"])), None)
        env.call(target.host, STOP, {"job": target.job, "agent": agent})

    def heal_after_crash(self, lab: HealLab, fault: DeadFault) -> str:
        """Stop the dead run's straggler (in the twin, or its agent on the host) and continue the rank."""
        host = dead_device(fault, fault.data.get("host"))
        agent = started_agent(fault)
        if lab.control is not None and agent is None:  # an emulated run: the twin ran the duty cycle
            pid = (fault.job or {}).get("pid")
            args = {"pid": pid} if pid is not None else {}
            twin_control(lab, fault).call(host, "stop_straggle", **args)
            return f"twin control stop_straggle on {host} {args or ''}".rstrip()
        if fault.job is None:
            raise FaultFailed(f"{fault.name}: the history does not say which rank the straggler was slowing")
        host = fault.job.get("host") or host
        done = lab.call(host, STOP, {"job": fault.job, "agent": agent}, "heal: stop the straggler")
        return describe_stop(host, fault.job["pid"], agent, done)


def started_agent(fault: DeadFault) -> int | None:
    """The agent's pid, if the dead run recorded gpu.straggle_start's result inside the injection."""
    for call in fault.calls:
        if call.get("op") == START and isinstance(call.get("value"), dict) and call["value"].get("agent"):
            return int(call["value"]["agent"])
    return None


def describe_stop(host: str, pid: int, agent: int | None, done: dict[str, Any]) -> str:
    """What gpu.straggle_stop did on `host` (`done`, its result), in words: the agents stopped, the rank continued."""
    agents = ", ".join(f"{a['pid']} {a['result']}" for a in done.get("agents", [])) or "none running"
    named = "" if agent is None else f" (the run's agent {agent}: {done.get('agent')})"
    if done.get("rank") == "not running":
        rank = f"pid {pid} is gone: nothing is left stopped"
    elif done.get("left_stopped"):
        rank = f"pid {pid}'s process group was left stopped: SIGCONT"
    else:
        rank = f"SIGCONT to pid {pid}'s process group"
    return f"straggler agents on {host}: {agents}{named}; {rank}"


STRAGGLE_FAULTS = (HostStraggle(),)
