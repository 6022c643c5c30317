"""GpuHost over SSH: nvidia-smi CSV, background jobs with a log file each, signals (drivers.capabilities).

Everything is plain POSIX shell + nvidia-smi, so the same calls work on a lab host's OpenSSH server and
on an emulated host. A job is started as

    CUDA_VISIBLE_DEVICES=0,1 TESTBED_JOB=NAME setsid env -C WORKDIR PROGRAM ARGS > LOG 2>&1 < /dev/null & echo $!

so its pid leads its own process group (stop and signal reach every process of the job) and it outlives
the SSH channel. WORKDIR and LOG are relative to the login directory unless absolute.

A running job is watched, without polling over SSH, on one persistent channel per rank:

    tail -n 0 -s 0.05 --pid=PID -F LOG

(GNU coreutils) prints each new log line as it is written and exits 0 once PID is gone, checking every
-s seconds; `watch` turns that into progress / exited events timestamped on receipt.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Iterator, Mapping

from drivers.capabilities import GpuInfo, GpuProcess, Identity, JobHandle, JobStatus, WatchEvent
from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.transports.ssh import ExecResult, SshTransport

GPU_QUERY = "index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw"
GPUS_ARGS = f"--query-gpu={GPU_QUERY} --format=csv,noheader,nounits"
APP_QUERY = "pid,process_name,used_memory,gpu_uuid"
LOST = re.compile(r"Unable to determine the device handle for (?:GPU|gpu )?\s*([0-9A-Fa-f:.]+)")
DRIVER_FAILURES = ("NVIDIA-SMI has failed", "Failed to initialize NVML", "couldn't communicate with the NVIDIA driver")
JOB_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SIGNALS = {"TERM", "KILL", "INT", "HUP", "STOP", "CONT", "USR1", "USR2", "QUIT"}
MARK = "--testbed-tail--"
STATUS_MARK = "--testbed-nvidia-smi-status--"  # health(): separates nvidia-smi's output and exit status from dmesg's
PS_STAT = re.compile(r"^[DIPRSTtWXZ][<NLsl+]*$")  # `ps -o stat=`: a state letter, then modifiers
# A pid or a step number: ASCII digits (str.isdigit() also accepts '²', which int() refuses), and not
# thousands of them (int() refuses those too).
NUMBER = re.compile(r"^[0-9]{1,18}$")
XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
SMI_FORMAT_HINT = "this nvidia-smi prints a format the driver does not know; report it with the output"
STRAGGLE_AGENT = "testbed-straggle"  # host.straggle's duty-cycle agent, one of testbed's host-side programs
INSTALL_AGENT = (
    "host.straggle needs testbed's host-side programs on the host (testbed-straggle, as for testbed-train): "
    "docs/jobs.md, 'The programs a GPU host runs'"
)


def _bus_key(bus_id: str) -> str:
    """'00000000:2A:00.0' and '0000:2A:00.0' name the same GPU: compare on BUS:DEV.FN, upper case."""
    return bus_id.strip().upper()[-7:]


def _number(text: str) -> float | None:
    text = text.strip()
    if text.startswith("[") or text in ("", "N/A"):
        return None
    return float(text.split()[0])


class GpuHostSsh:
    def __init__(self, transport: SshTransport, device: str) -> None:
        self.transport = transport
        self.device = device
        self.address = transport.address
        self._bus_index: dict[str, int] = {}

    def close(self) -> None:
        self.transport.close()

    def exec(self, command: str, **kwargs) -> ExecResult:
        return self.transport.exec(command, **kwargs)

    def _error(self, cls, message: str, **kw) -> DeviceError:
        return cls(message, device=self.device, address=self.address, **kw)

    # --- identity and GPUs ---------------------------------------------------------------------

    def identify(self) -> Identity:
        # One exec for both (a channel and a round trip fewer: a run connects to every host this way):
        # the hostname, then nvidia-smi's output and its exit status.
        query = "nvidia-smi --query-gpu=driver_version,name --format=csv,noheader"
        both = self.exec(f"hostname || echo ; {query} ; echo {STATUS_MARK} $?", check=False)  # a line each
        hostname, _, rest = both.stdout.partition("\n")
        smi_out, status, _ = self._split_status(both, rest)
        r = self._smi_checked(ExecResult(both.command, smi_out, both.stderr, status))
        hostname = hostname.strip()
        rows = [line.split(", ") for line in r.stdout.splitlines() if line and not LOST.search(line)]
        if not rows or len(rows[0]) < 2:
            raise self._error(
                DeviceProtocolError,
                "nvidia-smi listed no GPU",
                sent=r.command,
                received=r.stdout,
                hint=SMI_FORMAT_HINT,
            )
        version, name = rows[0][0], rows[0][1]
        return Identity(vendor="NVIDIA", model=f"{len(rows)}x {name}", serial=hostname, firmware=version)

    def _split_status(self, r: ExecResult, out: str) -> tuple[str, int, str]:
        """(nvidia-smi's output, its exit status, what followed) from `out`, a compound command's output in
        which `echo STATUS_MARK $?` followed nvidia-smi.
        """
        smi_out, found, rest = out.partition(f"{STATUS_MARK} ")
        status, _, after = rest.partition("\n")
        if not found or not status.strip().isascii() or not status.strip().isdigit():
            raise self._error(
                DeviceProtocolError,
                f"the output lacks nvidia-smi's exit status ({STATUS_MARK} N)",
                sent=r.command,
                received=r.stdout[-600:],
                hint="the host's login shell must be a POSIX shell (bash, dash) for `;` and `$?`",
            )
        return smi_out, int(status), after

    def _smi(self, args: str) -> ExecResult:
        return self._smi_checked(self.exec(f"nvidia-smi {args}", check=False))

    def _smi_checked(self, r: ExecResult) -> ExecResult:
        text = r.stdout + r.stderr
        if r.status == 0 or (r.status == 15 and LOST.search(text)):
            return r
        if any(f in text for f in DRIVER_FAILURES):
            raise self._error(
                DeviceCommandError,
                f"nvidia-smi cannot reach the NVIDIA driver (exit status {r.status}): {text.strip()[:300]}",
                sent=r.command,
                received=text,
                hint="the driver is not loaded or mismatches the library (after an update: reboot or reload the "
                "nvidia modules); `dmesg | grep NVRM` on the host shows why",
            )
        if "No devices were found" in text:
            return ExecResult(r.command, "", r.stderr, 0)
        raise self._error(
            DeviceCommandError,
            f"nvidia-smi failed with exit status {r.status}: {text.strip()[:300]}",
            sent=r.command,
            received=text,
            hint="127 means nvidia-smi is not on the PATH of a non-interactive login; 2 means this nvidia-smi "
            "does not know a queried field (driver too old?)",
        )

    def gpus(self) -> list[GpuInfo]:
        return self._parse_gpus(self._smi(GPUS_ARGS))

    def _parse_gpus(self, r: ExecResult) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        for line in r.stdout.splitlines():
            if not line.strip():
                continue
            lost = LOST.search(line)
            if lost:
                bus = lost.group(1).rstrip(":")
                out.append(GpuInfo(self._bus_index.get(_bus_key(bus), -1), "", "", bus, lost=True))
                continue
            cells = [c.strip() for c in line.split(", ")]
            try:
                if len(cells) != 9:
                    raise ValueError(f"expected 9 fields, got {len(cells)}")
                gpu = GpuInfo(
                    index=int(cells[0]),
                    name=cells[1],
                    uuid=cells[2],
                    bus_id=cells[3],
                    memory_total_mib=_number(cells[4]),
                    memory_used_mib=_number(cells[5]),
                    utilization_pct=_number(cells[6]),
                    temperature_c=_number(cells[7]),
                    power_w=_number(cells[8]),
                )
            except ValueError as exc:
                raise self._error(
                    DeviceProtocolError,
                    f"cannot parse nvidia-smi's CSV row {line!r}: {exc}",
                    sent=r.command,
                    received=r.stdout,
                    hint=SMI_FORMAT_HINT,
                ) from exc
            self._bus_index[_bus_key(gpu.bus_id)] = gpu.index
            out.append(gpu)
        return sorted(out, key=lambda g: (g.index < 0, g.index))

    def processes(self) -> list[GpuProcess]:
        r = self._smi(f"--query-compute-apps={APP_QUERY} --format=csv,noheader,nounits")
        out = []
        for line in r.stdout.splitlines():
            if not line.strip() or LOST.search(line) or line.startswith("No running"):
                continue
            cells = [c.strip() for c in line.split(", ")]
            try:
                out.append(GpuProcess(int(cells[0]), cells[1], cells[3], _number(cells[2])))
            except (ValueError, IndexError) as exc:
                raise self._error(
                    DeviceProtocolError,
                    f"cannot parse nvidia-smi's compute-apps row {line!r}: {exc}",
                    sent=r.command,
                    received=r.stdout,
                    hint=SMI_FORMAT_HINT,
                ) from exc
        return out

    def kernel_xids(self) -> list[str]:
        """The kernel log's `NVRM: Xid` lines (dmesg, or journalctl -k where dmesg is restricted)."""
        r = self.exec("dmesg", check=False)
        if r.status != 0:
            r = self.exec("journalctl -k --no-pager -o short", check=True)
        return [line for line in r.stdout.splitlines() if "NVRM: Xid" in line]

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
        if not JOB_NAME.match(name):
            raise ValueError(f"job name {name!r}: use 1-64 letters, digits, '_', '.', '-'")
        if not command:
            raise ValueError("empty job command")
        workdir = workdir or f"testbed-jobs/{name}"
        log = f"{workdir}/{name}.log"
        assignments = {"TESTBED_JOB": name, **(env or {})}
        if gpus is not None:
            assignments["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in gpus)
        for key in assignments:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"invalid environment variable name {key!r}")
        self.exec(f"mkdir -p {shlex.quote(workdir)}")
        line = " ".join(
            [f"{k}={shlex.quote(str(v))}" for k, v in assignments.items()]
            + ["setsid", "env", "-C", shlex.quote(workdir)]
            + [shlex.quote(str(a)) for a in command]
            + [">", shlex.quote(log), "2>&1", "<", "/dev/null", "&", "echo", "$!"]
        )
        r = self.exec(line, check=False)
        pid_text = r.stdout.strip()
        # pid 0 or 1 would make stop_job's `kill -- -PID` signal the login's own group or every process.
        if r.status != 0 or not NUMBER.match(pid_text) or int(pid_text) <= 1:
            raise self._error(
                DeviceCommandError,
                f"job {name!r} did not start (exit status {r.status}): {(r.stderr or r.stdout).strip()[:300]}",
                sent=line,
                received=r.stdout + r.stderr,
                hint=f"check that {command[0]!r} is installed on the host (and allowed, on an emulated host)",
            )
        return JobHandle(host=self.device, name=name, pid=int(pid_text), log=log, workdir=workdir)

    def job_status(self, job: JobHandle, progress: str | None = r"step (\d+)", tail_lines: int = 50) -> JobStatus:
        """Whether the job's process still runs, and its latest progress (`progress` matched on the log tail)."""
        r = self.exec(
            f"ps -o stat= -p {int(job.pid)} ; echo {MARK} ; tail -n {int(tail_lines)} {shlex.quote(job.log)}",
            check=False,
        )
        stat, mark, tail = r.stdout.partition(MARK + "\n")
        stat = stat.strip()
        if not mark or (stat and not PS_STAT.match(stat)):
            raise self._error(
                DeviceProtocolError,
                f"cannot read job {job.name!r}'s state (pid {job.pid}): expected ps's STAT code, then the line "
                f"{MARK!r}",
                sent=r.command,
                received=r.stdout[-2000:] + r.stderr[-500:],
                hint="the output was cut short or the host's ps is not procps (`ps -o stat= -p PID` must print "
                "a code like 'Ss' or nothing)",
            )
        if not stat or stat[0] in "ZX":
            state = "exited"
        elif stat[0] in "Tt":
            state = "stopped"
        else:
            state = "running"
        lines = [line for line in tail.splitlines() if line.strip()]
        found = None
        if progress:
            rx = re.compile(progress)
            for line in reversed(lines):
                m = rx.search(line)
                if m:
                    found = m.group(1) if m.groups() else m.group(0)
                    break
        return JobStatus(job.pid, state, found, lines[-1] if lines else None)

    def tail(self, path: str, lines: int = 50) -> str:
        return self.exec(f"tail -n {int(lines)} {shlex.quote(path)}").stdout

    def signal(self, pid: int, sig: str = "TERM", *, group: bool = True) -> None:
        """Send SIG to the job's whole process group (group=True) or to the one process."""
        sig = sig.upper().removeprefix("SIG")
        if sig not in SIGNALS and not sig.isdigit():
            raise ValueError(f"signal {sig!r}: use one of {sorted(SIGNALS)} or a number")
        target = f"-- -{int(pid)}" if group else str(int(pid))
        self.exec(f"kill -{sig} {target}")

    def stop_job(self, job: JobHandle, grace_s: float = 5.0, poll_s: float = 0.05) -> str:
        """SIGTERM the job's process group (and SIGCONT, should it be stopped); SIGKILL after grace_s.

        Returns "not running", "terminated" or "killed".
        """
        r = self.exec(f"kill -TERM -- -{int(job.pid)}", check=False)
        if r.status != 0:
            return "not running"
        self.exec(f"kill -CONT -- -{int(job.pid)}", check=False)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self._alive(job.pid):
                return "terminated"
            time.sleep(poll_s)
        self.exec(f"kill -KILL -- -{int(job.pid)}", check=False)
        return "killed"

    def _alive(self, pid: int) -> bool:
        stat = self.exec(f"ps -o stat= -p {int(pid)}", check=False).stdout.strip()
        return bool(stat) and stat[0] not in "ZX"

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
        if not 0.0 < float(duty) < 1.0 or not 0.0 < float(period_ms) < float("inf"):
            raise ValueError(f"need 0 < duty < 1 and period_ms > 0, got duty={duty!r}, period_ms={period_ms!r}")
        log = straggle_log(job)
        args = ["--pid", str(int(job.pid)), "--duty", repr(float(duty)), "--period-ms", repr(float(period_ms))]
        line = " ".join(
            ["setsid", STRAGGLE_AGENT, *args, ">", shlex.quote(log), "2>&1", "<", "/dev/null", "&", "echo", "$!"]
        )
        r = self.exec(line, check=False)
        pid_text = r.stdout.strip()
        if r.status != 0 or not NUMBER.match(pid_text) or int(pid_text) <= 1:
            raise self._error(
                DeviceCommandError,
                f"the straggler agent for pid {job.pid} did not start (exit status {r.status}): "
                f"{(r.stderr or r.stdout).strip()[:300]}",
                sent=line,
                received=r.stdout + r.stderr,
                hint=INSTALL_AGENT,
            )
        agent = int(pid_text)
        handle = JobHandle(self.device, f"straggle-{job.pid}", agent, log, job.workdir)
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        why: DeviceError | None = None
        watch = self.watch(handle, heartbeat_s=heartbeat_s, progress=None, lines=None)
        try:
            for ev in watch:
                if ev.line is not None:
                    if ev.line.startswith(f"{STRAGGLE_AGENT} {agent} started"):
                        return agent, ev.monotonic_ns, log
                    seen = [*seen[-4:], ev.line]
                if ev.kind == "exited":
                    raise self._error(
                        DeviceCommandError,
                        f"the straggler agent for pid {job.pid} (agent pid {agent}) exited before it started: "
                        f"{(seen or ['no output'])[-1][:300]}",
                        sent=line,
                        received="\n".join(seen),
                        hint=f"read its log {log} on the host; " + INSTALL_AGENT,
                    )
                if time.monotonic() >= deadline:
                    why = self._error(
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
            self.exec(f"kill -TERM {agent}", check=False)
        except DeviceError:
            pass
        raise why

    def straggle_agents(self, pid: int) -> list[int]:
        """The pids of the duty-cycle agents this host runs on pid's group (found by their command line; the
        `[t]` keeps the shell running pgrep from matching its own command line).
        """
        pattern = f"[t]estbed-straggle --pid {int(pid)}( |$)"
        r = self.exec(f"pgrep -f {shlex.quote(pattern)}", check=False)
        found = r.stdout.split()
        if r.status not in (0, 1) or not all(NUMBER.match(p) for p in found):
            raise self._error(
                DeviceProtocolError,
                f"cannot list the straggler agents of pid {pid} (pgrep exit status {r.status})",
                sent=r.command,
                received=r.stdout + r.stderr,
                hint="the host needs procps' pgrep (-f matches the whole command line)",
            )
        return sorted(int(p) for p in found)

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
        agents = self.straggle_agents(job.pid)
        ended: dict[int, str] = {}
        if agents:
            self.exec("kill -TERM " + " ".join(str(a) for a in agents), check=False)
            deadline = time.monotonic() + grace_s
            alive = self._living(agents)
            while alive and time.monotonic() < deadline:
                time.sleep(poll_s)
                alive = self._living(alive)
            if alive:
                self.exec("kill -KILL " + " ".join(str(a) for a in alive), check=False)
            ended = {a: "killed" if a in alive else "terminated" for a in agents}
        stat = self.exec(f"ps -o stat= -p {int(job.pid)}", check=False).stdout.strip()
        if not stat or stat[0] in "ZX":
            rank, left_stopped = "not running", False
        else:
            left_stopped = stat[0] in "Tt"
            r = self.exec(f"kill -CONT -- -{int(job.pid)}", check=False)
            rank = "continued" if r.status == 0 else "not running"  # it exited between the look and the signal
        return {
            "agents": [{"pid": a, "result": how} for a, how in ended.items()],
            "agent": None if agent is None else ended.get(int(agent), "not running"),
            "left_stopped": left_stopped,
            "rank": rank,
        }

    def _living(self, pids: list[int]) -> list[int]:
        """Those of pids that are processes still running (a zombie is not)."""
        r = self.exec(f"ps -o pid=,stat= -p {','.join(str(int(p)) for p in pids)}", check=False)
        rows = [line.split() for line in r.stdout.splitlines() if line.strip()]
        return sorted(int(row[0]) for row in rows if len(row) == 2 and NUMBER.match(row[0]) and row[1][0] not in "ZX")

    # --- watching a job and probing health ---------------------------------------------------

    def watch(
        self,
        job: JobHandle,
        *,
        heartbeat_s: float = 0.05,
        progress: str | None = r"step (\d+)",
        lines: int | None = 0,
    ) -> Iterator[WatchEvent]:
        """Follow the job's log on one channel until its process is gone.

        Yields "progress" / "line" events for each log line as it arrives (lines: how many existing lines
        to report first, None for the whole log), "idle" when nothing arrived for heartbeat_s, and a final
        "exited" once the process has died (noticed by the host's tail within heartbeat_s). A line's time is
        its arrival on this machine (never earlier than the line before); an idle's is when the silence was
        noticed, so a line read just after a tick can carry an earlier time than the tick. Stop iterating
        (or close the generator) to end the watch early; that closes the channel.
        """
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        rx = re.compile(progress) if progress else None
        first = "+1" if lines is None else str(int(lines))
        command = f"tail -n {first} -s {heartbeat_s:g} --pid={int(job.pid)} -F {shlex.quote(job.log)}"
        pending, errors = b"", ""
        for chunk in self.transport.stream(command, idle_s=heartbeat_s):
            if chunk.kind == "out":
                end = -len(pending)  # where each line's newline is in this chunk: the line's time is its arrival
                *complete, pending = (pending + chunk.data).split(b"\n")
                for raw in complete:
                    end += len(raw) + 1
                    yield _line_event(raw, rx, chunk.arrival_ns(end - 1))
            elif chunk.kind == "err":
                errors = (errors + chunk.data.decode("utf-8", errors="backslashreplace"))[-2000:]
            elif chunk.kind == "idle":
                yield WatchEvent("idle", None, None, chunk.mono_ns)
            elif chunk.kind == "exit":
                if pending:
                    yield _line_event(pending, rx, chunk.mono_ns)
                if chunk.status == 0:
                    yield WatchEvent("exited", None, None, chunk.mono_ns)
                    return
                raise self._error(
                    DeviceCommandError,
                    f"the watch on job {job.name!r} (pid {job.pid}) ended with exit status {chunk.status}: "
                    f"{errors.strip()[:300]}",
                    sent=command,
                    received=errors,
                    hint="the host needs GNU coreutils tail (--pid, -F, fractional -s); busybox tail lacks --pid",
                )

    def health(self) -> dict:
        """One probe: GPUs as nvidia-smi lists them (lost ones too), the kernel log's Xid lines.

        ok is false when nvidia-smi fails (driver gone), a GPU is lost or the kernel log holds an Xid line
        (since boot: compare `xids` with an earlier probe to see new ones). A kernel log that cannot be
        read is reported in kernel_log_error and does not make the host unhealthy on its own.
        """
        error = kernel_error = None
        # One exec for both (a round trip and a channel fewer per probe): nvidia-smi, its exit status, dmesg.
        r = self.exec(f"nvidia-smi {GPUS_ARGS} ; echo {STATUS_MARK} $? ; dmesg", check=False)
        smi_out, status, kernel = self._split_status(r, r.stdout)
        try:
            gpus = self._parse_gpus(self._smi_checked(ExecResult(r.command, smi_out, r.stderr, status)))
        except DeviceCommandError as exc:
            gpus, error = [], exc.message
        if r.status == 0:
            xids = [line for line in kernel.splitlines() if "NVRM: Xid" in line]
        else:  # dmesg is restricted here: the journal instead (kernel_xids' fallback)
            try:
                xids = self.kernel_xids()
            except DeviceCommandError as exc:
                xids, kernel_error = [], exc.message
        lost = [g.index for g in gpus if g.lost]
        codes = sorted({int(m.group(1)) for line in xids if (m := XID.search(line))})
        return {
            "ok": error is None and not lost and not xids,
            "gpus": [dataclasses.asdict(g) for g in gpus],
            "lost": lost,
            "xids": xids,
            "xid_codes": codes,
            "error": error,
            "kernel_log_error": kernel_error,
        }


def straggle_log(job: JobHandle) -> str:
    """Where the straggler agent of a job writes: the job's folder, or the login directory without one."""
    name = f"straggle-{int(job.pid)}.log"
    return f"{job.workdir.rstrip('/')}/{name}" if job.workdir else name


def _line_event(raw: bytes, rx: re.Pattern | None, ns: int) -> WatchEvent:
    line = raw.decode("utf-8", errors="backslashreplace").rstrip("\r")
    m = rx.search(line) if rx is not None else None
    if m is None:
        return WatchEvent("line", line, None, ns)
    text = m.group(1) if m.groups() else m.group(0)
    return WatchEvent("progress", line, int(text) if NUMBER.match(text) else None, ns)
