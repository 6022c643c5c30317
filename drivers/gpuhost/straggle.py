"""The straggler agent's life on a GPU host (host.straggle on a lab; hostside/straggle_agent.py): its start,
the agents running on a job, and their end with the job's group left running.
"""

from __future__ import annotations

import shlex
import time

from drivers.capabilities import JobHandle
from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.gpuhost.jobs import has_exited, started_pid
from drivers.gpuhost.reply import NUMBER
from drivers.gpuhost.shell import HostShell
from drivers.gpuhost.watch import follow

STRAGGLE_AGENT = "testbed-straggle"  # host.straggle's duty-cycle agent, one of testbed's host-side programs
INSTALL_AGENT = (
    "host.straggle needs testbed's host-side programs on the host (testbed-straggle, as for testbed-train): "
    "docs/jobs.md, 'The programs a GPU host runs'"
)


def straggle_log(job: JobHandle) -> str:
    """Where the straggler agent of a job writes: the job's folder, or the login directory without one."""
    name = f"straggle-{int(job.pid)}.log"
    return f"{job.workdir.rstrip('/')}/{name}" if job.workdir else name


def agent_line(job: JobHandle, duty: float, period_ms: float) -> str:
    """The command line that starts the agent on the job's group, in a session of its own, logging to
    straggle_log(job) (ValueError unless 0 < duty < 1 and period_ms > 0).
    """
    if not 0.0 < float(duty) < 1.0 or not 0.0 < float(period_ms) < float("inf"):
        raise ValueError(f"need 0 < duty < 1 and period_ms > 0, got duty={duty!r}, period_ms={period_ms!r}")
    args = ["--pid", str(int(job.pid)), "--duty", repr(float(duty)), "--period-ms", repr(float(period_ms))]
    redirect = [">", shlex.quote(straggle_log(job)), "2>&1", "<", "/dev/null"]
    return " ".join(["setsid", STRAGGLE_AGENT, *args, *redirect, "&", "echo", "$!"])


def living(ps_output: str) -> list[int]:
    """The pids `ps -o pid=,stat=` lists as running (a zombie is not), in order."""
    rows = [line.split() for line in ps_output.splitlines() if line.strip()]
    return sorted(int(row[0]) for row in rows if len(row) == 2 and NUMBER.match(row[0]) and not has_exited(row[1]))


class StraggleAgents:
    """Start the duty-cycle agent on a job's process group, find the agents running on it, and end them."""

    def __init__(self, shell: HostShell) -> None:
        self.shell = shell

    def start(
        self, job: JobHandle, duty: float, period_ms: float, timeout_s: float, heartbeat_s: float
    ) -> tuple[int, int, str]:
        line = agent_line(job, duty, period_ms)
        log = straggle_log(job)
        r = self.shell.exec(line, check=False)
        agent = started_pid(r.stdout)
        if r.status != 0 or agent is None:
            raise self.shell.error(
                DeviceCommandError,
                f"the straggler agent for pid {job.pid} did not start (exit status {r.status}): "
                f"{(r.stderr or r.stdout).strip()[:300]}",
                sent=line,
                received=r.stdout + r.stderr,
                hint=INSTALL_AGENT,
            )
        handle = JobHandle(self.shell.device, f"straggle-{job.pid}", agent, log, job.workdir)
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        why: DeviceError | None = None
        watch = follow(self.shell, handle, heartbeat_s=heartbeat_s, progress=None, lines=None)
        try:
            for ev in watch:
                if ev.line is not None:
                    if ev.line.startswith(f"{STRAGGLE_AGENT} {agent} started"):
                        return agent, ev.monotonic_ns, log
                    seen = [*seen[-4:], ev.line]
                if ev.kind == "exited":
                    raise self.shell.error(
                        DeviceCommandError,
                        f"the straggler agent for pid {job.pid} (agent pid {agent}) exited before it started: "
                        f"{(seen or ['no output'])[-1][:300]}",
                        sent=line,
                        received="\n".join(seen),
                        hint=f"read its log {log} on the host; " + INSTALL_AGENT,
                    )
                if time.monotonic() >= deadline:
                    why = self.shell.error(
                        DeviceTimeout,
                        f"the straggler agent for pid {job.pid} (agent pid {agent}) printed no start line within "
                        f"{timeout_s:g} s; it was sent SIGTERM",
                        sent=line,
                        received="\n".join(seen),
                        hint=f"read its log {log} on the host",
                    )
                    break
        except DeviceError as exc:  # it exited, or the watch failed (the connection dropped): not injected
            why = exc
        finally:
            watch.close()
        if why is None:
            raise AssertionError("unreachable: a watch ends with an exited event")
        # Not injected, so no agent is left running either (it continues the group as it ends), if the host
        # can still be told.
        try:
            self.shell.exec(f"kill -TERM {agent}", check=False)
        except DeviceError:
            pass
        raise why

    def running(self, pid: int) -> list[int]:
        # The `[t]` keeps the shell running pgrep from matching its own command line.
        pattern = f"[t]estbed-straggle --pid {int(pid)}( |$)"
        r = self.shell.exec(f"pgrep -f {shlex.quote(pattern)}", check=False)
        found = r.stdout.split()
        if r.status not in (0, 1) or not all(NUMBER.match(p) for p in found):
            raise self.shell.error(
                DeviceProtocolError,
                f"cannot list the straggler agents of pid {pid} (pgrep exit status {r.status})",
                sent=r.command,
                received=r.stdout + r.stderr,
                hint="the host needs procps' pgrep (-f matches the whole command line)",
            )
        # pgrep matches command lines and says nothing of state; ps says whether each still runs. An agent
        # killed outright is a zombie until its reaper gets to it (on a host whose PID 1 never reaps: never).
        return self._living([int(p) for p in found]) if found else []

    def stop(self, job: JobHandle, agent: int | None, grace_s: float, poll_s: float) -> dict:
        agents = self.running(job.pid)
        ended: dict[int, str] = {}
        if agents:
            self.shell.exec("kill -TERM " + " ".join(str(a) for a in agents), check=False)
            deadline = time.monotonic() + grace_s
            alive = self._living(agents)
            while alive and time.monotonic() < deadline:
                time.sleep(poll_s)
                alive = self._living(alive)
            if alive:
                self.shell.exec("kill -KILL " + " ".join(str(a) for a in alive), check=False)
            ended = {a: "killed" if a in alive else "terminated" for a in agents}
        stat = self.shell.exec(f"ps -o stat= -p {int(job.pid)}", check=False).stdout.strip()
        if has_exited(stat):
            rank, left_stopped = "not running", False
        else:
            left_stopped = stat[0] in "Tt"
            r = self.shell.exec(f"kill -CONT -- -{int(job.pid)}", check=False)
            rank = "continued" if r.status == 0 else "not running"  # it exited between the look and the signal
        return {
            "agents": [{"pid": a, "result": how} for a, how in ended.items()],
            "agent": None if agent is None else ended.get(int(agent), "not running"),
            "left_stopped": left_stopped,
            "rank": rank,
        }

    def _living(self, pids: list[int]) -> list[int]:
        r = self.shell.exec(f"ps -o pid=,stat= -p {','.join(str(int(p)) for p in pids)}", check=False)
        return living(r.stdout)
