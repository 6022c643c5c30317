"""GpuHostSsh: the GpuHost capability (drivers/capabilities.py) over SSH, composed of the host's parts.

Probes (drivers/gpuhost/probes.py), jobs (jobs.py), the failure watch (watch.py) and the straggler agent
(straggle.py) share one HostShell: one SSH connection, every command audited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from drivers.capabilities import GpuHost, GpuInfo, GpuProcess, Identity, JobHandle, JobStatus, WatchEvent
from drivers.gpuhost.jobs import Jobs
from drivers.gpuhost.probes import HostProbes
from drivers.gpuhost.shell import HostShell
from drivers.gpuhost.smi_xml import SmiReport
from drivers.gpuhost.straggle import StraggleAgents
from drivers.gpuhost.watch import follow
from drivers.transports.ssh import ExecResult, SshTransport


class GpuHostSsh(GpuHost):
    """A Linux GPU server over SSH: nvidia-smi, background jobs with a log file each, signals, the straggler
    agent.
    """

    def __init__(self, transport: SshTransport, device: str) -> None:
        self._shell = HostShell(transport, device)
        self._probes = HostProbes(self._shell)
        self._jobs = Jobs(self._shell)
        self._straggle = StraggleAgents(self._shell)

    @property
    def transport(self) -> SshTransport:
        return self._shell.transport

    @property
    def device(self) -> str:
        return self._shell.device

    @property
    def address(self) -> str:
        return self._shell.address

    def close(self) -> None:
        self.transport.close()

    def exec(self, command: str, **kwargs) -> ExecResult:
        return self._shell.exec(command, **kwargs)

    # --- identity and GPUs ---------------------------------------------------------------------

    def identify(self) -> Identity:
        return self._probes.identify()

    def gpus(self) -> list[GpuInfo]:
        return self._probes.gpus()

    def processes(self) -> list[GpuProcess]:
        return self._probes.processes()

    def kernel_xids(self) -> list[str]:
        """The kernel log's `NVRM: Xid` lines (dmesg, or journalctl -k where dmesg is restricted)."""
        return self._probes.kernel_xids()

    def health(self, details: bool = False) -> dict:
        """One probe: GPUs as nvidia-smi lists them (lost ones too), the kernel log's Xid lines.

        ok is false when nvidia-smi fails (driver gone), a GPU is lost or the kernel log holds an Xid line
        (since boot: compare `xids` with an earlier probe to see new ones). A kernel log that cannot be
        read is reported in kernel_log_error and does not make the host unhealthy on its own.

        details=True adds what `nvidia-smi -q -x` says of each GPU (`readings`: ECC, retired pages, remapped
        rows, clocks event reasons, persistence, NVLink fabric, ...; a slower command on a real host, so not
        for a tight loop) and `conditions`: {gpu, bus_id, condition, detail} for each condition a lab acts on
        (smi_xml.CONDITIONS: pending retired pages, remapped rows pending or failed, uncorrected ECC errors,
        a hardware slowdown or power brake, ...); any makes ok false. A report that cannot be read is in
        readings_error, not unhealthy on its own.
        """
        return self._probes.health(details)

    def gpu_report(self) -> SmiReport:
        """`nvidia-smi -q -x` read into typed readings per GPU (drivers/gpuhost/smi_xml.py)."""
        return self._probes.report()

    # --- jobs ----------------------------------------------------------------------------------

    def run_job(
        self,
        command: list[str],
        *,
        name: str,
        gpus: list[int] | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> JobHandle:
        """Start `command` in the background in its own process group; returns its pid and log file."""
        return self._jobs.run(command, name, gpus, env, workdir)

    def job_status(self, job: JobHandle, progress: str | None = r"step (\d+)", tail_lines: int = 50) -> JobStatus:
        """Whether the job's process still runs, and its latest progress (`progress` matched on the log tail)."""
        return self._jobs.status(job, progress, tail_lines)

    def tail(self, path: str, lines: int = 50) -> str:
        return self._jobs.tail(path, lines)

    def signal(self, pid: int, sig: str = "TERM", *, group: bool = True) -> None:
        """Send SIG to the job's whole process group (group=True) or to the one process."""
        self._jobs.signal(pid, sig, group)

    def stop_job(self, job: JobHandle, grace_s: float = 5.0, poll_s: float = 0.05) -> str:
        """SIGTERM the job's process group (and SIGCONT, should it be stopped); SIGKILL after grace_s.

        Returns "not running", "terminated" or "killed".
        """
        return self._jobs.stop(job, grace_s, poll_s)

    # --- the straggler agent (host.straggle on a lab; hostside/straggle_agent.py) ------------

    def start_straggle(
        self, job: JobHandle, duty: float, period_ms: float, *, timeout_s: float = 30.0, heartbeat_s: float = 0.02
    ) -> tuple[int, int, str]:
        """Start the host's duty-cycle agent on the job's process group: stopped `duty` of every `period_ms`.

            setsid testbed-straggle --pid PID --duty D --period-ms M > LOG 2>&1 < /dev/null & echo $!

        It runs in a session of its own, outlives this SSH channel, and times the cycle on the host. Its
        log is `straggle-PID.log` in the job's folder. Waits (following the log) for the agent's start line,
        which it prints once it has stopped the group the first time. Returns (the agent's pid, the moment
        that line arrived here in monotonic ns, the log).
        """
        return self._straggle.start(job, duty, period_ms, timeout_s, heartbeat_s)

    def straggle_agents(self, pid: int) -> list[int]:
        """The pids of the duty-cycle agents this host runs on pid's group (found by their command line)."""
        return self._straggle.running(pid)

    def stop_straggle(
        self, job: JobHandle, agent: int | None = None, *, grace_s: float = 5.0, poll_s: float = 0.02
    ) -> dict:
        """End the duty cycle on the job's process group: SIGTERM to every agent the host runs on it (the one
        started, `agent`, is only signalled if pgrep still lists it: its pid may be another process's by
        now), SIGKILL to any left after grace_s, then, once they are gone, SIGCONT to the group whatever they
        did (an agent that was SIGKILLed leaves it stopped).

        Returns {"agents": [{"pid", "result": "terminated" | "killed"}], "agent": what became of `agent`
        ("not running" if pgrep did not list it; None if not given),
        "left_stopped": whether the group's leader was still stopped once the agents were gone,
        "rank": "continued" or "not running"}.
        """
        return self._straggle.stop(job, agent, grace_s, poll_s)

    # --- watching a job ------------------------------------------------------------------------

    def watch(
        self,
        job: JobHandle,
        *,
        heartbeat_s: float = 0.05,
        progress: str | None = r"step (\d+)",
        lines: int | None = 0,
    ) -> Iterator[WatchEvent]:
        """Follow the job's log on one channel until its process has exited.

        Yields "progress" / "line" events for each log line as it arrives (lines: how many existing lines
        to report first, None for the whole log), "idle" when nothing arrived for heartbeat_s, and a final
        "exited" once the process has died, a zombie or reaped (noticed on the host within about a heartbeat:
        watch.py). A line's time is its arrival on this machine (never earlier than the line before); an
        idle's is when the silence was noticed, so a line read just after a tick can carry an earlier time
        than the tick. Stop iterating (or close the generator) to end the watch early; that closes the channel.
        """
        return follow(self._shell, job, heartbeat_s=heartbeat_s, progress=progress, lines=lines)
