"""The emulated GPU host's state: GPUs, job processes, kernel log, power; and its control ops.

Thread-safe: SSH channel threads run commands (emulators/gpuhost/shell/) while the twin's event loop
calls the control ops. Job processes are real child processes, each in its own process group, started in
the host's private directory; nothing outside the allowlist is ever executed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from emulators.gpuhost.joblog import LogCopier
from emulators.gpuhost.nvsmi import App, Gpu, View
from emulators.gpuhost.nvsmi_xml import CONDITIONS, XID_CONDITIONS
from emulators.gpuhost.spec import GpuHostSpec
from emulators.netns import entered
from emulators.truth import GroundTruth

XID_TEXT = {
    13: "Graphics Exception: ESR 0x404600=0x80000001",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f0f_0c000000.",
    43: "Ch 00000010, engmask 00000101, intr 10000000",
    45: "Ch 00000010, engmask 00000101, intr 10000000",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: All reserved rows for bank are remapped",
    74: "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
    120: "GSP task exception",
}
BOOT_LINES = (
    "Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0)",
    "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-18-amd64 root=/dev/md0 ro quiet",
    "nvidia: loading out-of-tree module taints kernel.",
    "nvidia-nvlink: Nvlink Core is being initialized, major device number 236",
)
# Tools every emulated host has installed besides the inventory's job programs, as a lab's hosts have testbed
# installed for its workload: the straggler agent a lab's host.straggle starts over SSH (docs/faults.md).
HOST_TOOLS = frozenset({"testbed-straggle"})
# Launchers every emulated host has, as a lab's hosts have PyTorch: `torchrun` runs the stand-in
# emulators/gpuhost/torchrun/ (python -m), told the host's job programs, the only ones it will start. Its
# workers are the job's ranks, in its process group: a launcher holds the GPUs it was given, as a job does.
LAUNCHERS = {"torchrun": "emulators.gpuhost.torchrun"}

GPU_MEMORY_PER_JOB_MIB = 30_000
JOB_NICE = 10  # see GpuHostEngine.spawn


@dataclass
class Job:
    pid: int
    argv: list[str]
    name: str | None  # TESTBED_JOB in its environment, if any
    gpus: list[int]
    log: str | None  # path relative to the host's home, if its output goes to a file
    started: float  # monotonic
    proc: subprocess.Popen
    returncode: int | None = None
    straggle: threading.Event | None = None  # set to stop the duty-cycle thread
    copier: LogCopier | None = None  # carries its output into its log file (see GpuHostEngine.spawn)
    # Set once the process has exited and all it wrote is in its log file; until then the host's tools see it
    # as running (joblog.py).
    flushed: threading.Event = field(default_factory=threading.Event)
    partial: bytes = b""  # the start of an output line not yet complete (for the ground truth)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class KernelLog:
    boot: float = field(default_factory=time.monotonic)  # monotonic time of "boot"
    boot_wall: float = field(default_factory=time.time)
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since boot, message)

    def add(self, message: str) -> None:
        self.lines.append((time.monotonic() - self.boot, message))


class GpuHostEngine:
    """One host. Its home is a private directory; `programs` resolves an allowlisted name to a path."""

    def __init__(self, spec: GpuHostSpec, home: Path) -> None:
        self.spec = spec
        self.home = home.resolve()
        self._lock = threading.RLock()
        rng = random.Random(f"{spec.seed}:{spec.name}")
        self.gpus = [
            Gpu(
                index=i,
                name=spec.gpu_name,
                uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                serial=str(1650000000000 + rng.randrange(10**9)),
                memory_mib=spec.memory_mib,
                driver_version=spec.driver_version,
                base_temp=28 + rng.randrange(8),
            )
            for i in range(spec.gpus)
        ]
        self.jobs: dict[int, Job] = {}
        self.subshells: dict[int, threading.Event] = {}  # background loops of command lines, by pid (subshell)
        self.powered = True
        self.driver_loaded = True
        self.kernel = self._boot_log()
        self.on_power: Callable[[bool], None] | None = None  # the SSH server listens / stops listening
        self.netns: str | None = None  # with --netns: the host's network namespace, where its processes start
        self.profile: dict[str, str] = {}  # with --netns: what a lab host's login environment would add (place)
        self.truth: GroundTruth | None = None  # the twin's ground-truth log, when the twin keeps one
        # Bumped and notified whenever the host appends a job's output to its log file: `tail -F` wakes on
        # it at once, as GNU tail does on inotify, instead of finding the data on its next poll.
        self.appended = threading.Condition()
        self.appended_count = 0

    # --- queries used by the shell -------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def view(self) -> View:
        with self._lock:
            apps = [
                App(j.pid, j.argv[0], g, GPU_MEMORY_PER_JOB_MIB, running=_proc_state(j.pid) not in ("T", "t"))
                for j in self.jobs.values()
                if j.alive
                for g in j.gpus
            ]
            return View([_copy_gpu(g) for g in self.gpus], apps, self.driver_loaded)

    @contextlib.contextmanager
    def subshell(self) -> Iterator[tuple[int, threading.Event]]:
        """A background loop of a command line, while it runs: its pid (the native id of the thread running it:
        a pid of this machine no other process has meanwhile) and the event that `kill`ing it sets.
        """
        pid, ended = threading.get_native_id(), threading.Event()
        with self._lock:
            self.subshells[pid] = ended
        try:
            yield pid, ended
        finally:
            with self._lock:
                del self.subshells[pid]

    def live_subshells(self) -> dict[int, threading.Event]:
        with self._lock:
            return dict(self.subshells)

    def live_jobs(self) -> list[Job]:
        with self._lock:
            return [j for j in self.jobs.values() if j.alive and job_state(j) not in (None, "Z")]

    def program_path(self, name: str) -> str | None:
        if name in LAUNCHERS:
            return sys.executable
        if name not in self.spec.jobs and name not in HOST_TOOLS:
            return None
        search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
        return shutil.which(name, path=search)

    def job_env(self, assignments: dict[str, str]) -> dict[str, str]:
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        env = {
            "PATH": path,
            "HOME": str(self.home),
            "USER": self.spec.user,
            "LOGNAME": self.spec.user,
            "HOSTNAME": self.spec.name,
            "LANG": "C.UTF-8",
        }
        if os.environ.get("PYTHONPATH"):  # the twin's own import path: run the same testbed-train
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env.update(self.profile)
        env.update(assignments)
        return env

    def spawn(
        self,
        argv: list[str],
        executable: str,
        *,
        cwd: Path,
        env: dict[str, str],
        stdin,
        stdout,
        stderr,
        log: str | None,
    ) -> Job:
        """Start one job program as a real child process in a new process group (session).

        Output redirected to a log file goes through a pipe the host copies into the file, line by line:
        the host then knows when each line was written (ground truth) and wakes `tail -F` readers at once.
        """
        # A host tool (the straggler agent) is no CUDA program: it holds no GPU, and a lost GPU or driver
        # leaves it running.
        tool = argv[0] in HOST_TOOLS
        gpus = [] if tool else _visible(env.get("CUDA_VISIBLE_DEVICES"), len(self.gpus))
        sink = os.dup(stdout.fileno()) if log is not None and hasattr(stdout, "fileno") else None
        with self._lock, entered(self.netns):  # a child starts in its forking thread's network namespace
            try:
                if argv[0] in LAUNCHERS:
                    env = {**env, "TESTBED_EMULATED_PROGRAMS": ",".join(self.spec.jobs)}
                proc = subprocess.Popen(  # argv[0] is an allowlisted program; never a shell
                    [executable, *(["-m", LAUNCHERS[argv[0]]] if argv[0] in LAUNCHERS else []), *argv[1:]],
                    cwd=cwd,
                    env=env,
                    stdin=stdin,
                    stdout=stdout if sink is None else subprocess.PIPE,
                    stderr=stderr,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError:
                if sink is not None:
                    os.close(sink)
                raise
            job = Job(proc.pid, list(argv), env.get("TESTBED_JOB"), gpus, log, time.monotonic(), proc)
            self.jobs[proc.pid] = job
            # On a lab a job has its host's CPUs to itself; here it shares this machine with the twin and the
            # framework, which stand in for other machines (switches, NICs, sshd, the control host). A lower
            # priority keeps a CPU-hungry job from delaying them, as it could not on a lab.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, JOB_NICE)
            broken = not tool and (not self.driver_loaded or any(self.gpus[g].lost for g in gpus))
        self.record_truth("spawn", pid=proc.pid, job=job.name, argv=list(argv))
        if sink is not None:
            pipe, proc.stdout = proc.stdout, None  # the copier's alone: a foreground pump reads stderr only
            assert pipe is not None  # stdout=PIPE above
            job.copier = LogCopier(pipe, sink, lambda data, t_ns: self._copied(job, data, t_ns), f"out-{proc.pid}")
            job.copier.start()
        threading.Thread(target=self._reap, args=(job,), name=f"reap-{proc.pid}", daemon=True).start()
        if broken:  # CUDA initialisation fails on a lost GPU / without a driver: the process dies at once
            job.signal_group(signal.SIGKILL)
        return job

    def _reap(self, job: Job) -> None:
        """Once the job's process has exited: its exit in the ground truth, then, once all it wrote is in its log
        file (joblog.py), the process reaped and its return code kept.
        """
        with contextlib.suppress(ChildProcessError):  # reaped by another waiter meanwhile (reset)
            os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie
        exited_ns = time.monotonic_ns()
        if job.copier is not None:
            job.copier.drain()
        job.flushed.set()
        code = job.proc.wait()
        self.record_truth("exit", exited_ns, pid=job.pid, job=job.name, code=code)
        with self._lock:
            job.returncode = code
            if job.straggle is not None:
                job.straggle.set()

    def _copied(self, job: Job, data: bytes, t_ns: int) -> None:
        """A chunk of a job's output is in its log file: `tail -F` readers are woken, and each complete line is
        timestamped in the ground truth (the moment the host read it, before anyone could see it in the file).
        """
        with self.appended:
            self.appended_count += 1
            self.appended.notify_all()
        # Written down after the readers are woken: the record's own cost is not in their way.
        if self.truth is not None:
            *lines, job.partial = (job.partial + data).split(b"\n")
            for line in lines:
                self.truth.record("line", t_ns, host=self.spec.name, pid=job.pid, job=job.name, line=_text(line))

    def record_truth(self, event: str, t_ns: int | None = None, **fields) -> None:
        if self.truth is not None:
            self.truth.record(event, t_ns, host=self.spec.name, **fields)

    # --- control ops (called by the twin) ------------------------------------------------------

    control_ops = (
        "fail_gpu",
        "raise_xid",
        "degrade_gpu",
        "recover_gpu",
        "unload_driver",
        "load_driver",
        "power_off",
        "power_on",
        "straggle",
        "stop_straggle",
        "reset",
        "state",
    )

    def fail_gpu(self, index: int, xid: int = 79) -> dict:
        """The GPU raises an Xid and is lost (nvidia-smi cannot reach it); its processes die."""
        with self._lock:
            gpu = self._gpu(index)
            gpu.lost, gpu.xid = True, int(xid)
            victims = [j for j in self.jobs.values() if j.alive and index in j.gpus]
            # The processes die first, at the moment a timed fault was set for; the kernel's lines follow, in
            # the same hold of the lock, so nobody sees the one without the other.
            t_ns = time.monotonic_ns()
            for job in victims:
                job.signal_group(signal.SIGKILL)
            pci = f"PCI:0000:{gpu.short_bus_id[5:7]}:00"
            pid = f"pid={victims[0].pid}, " if victims else "pid='<unknown>', "
            self.kernel.add(f"NVRM: GPU at {pci}: {gpu.uuid}")
            self.kernel.add(f"NVRM: GPU Board Serial Number: {gpu.serial}")
            self.kernel.add(f"NVRM: Xid ({pci}): {int(xid)}, {pid}{XID_TEXT.get(int(xid), 'Unknown Error')}")
            if int(xid) == 79:
                self.kernel.add(f"NVRM: GPU {gpu.short_bus_id}: GPU has fallen off the bus.")
            self.record_truth("fault", t_ns, op="fail_gpu", gpu=index, xid=int(xid), pids=[j.pid for j in victims])
            return {"gpu": index, "xid": int(xid), "killed": [j.pid for j in victims]}

    def raise_xid(self, index: int, xid: int = 63) -> dict:
        """An Xid the GPU survives (63: row remapping pending, 94: contained ECC): a kernel log line only;
        the GPU stays visible and its processes keep running.
        """
        with self._lock:
            gpu = self._gpu(index)
            pci = f"PCI:0000:{gpu.short_bus_id[5:7]}:00"
            self.kernel.add(f"NVRM: Xid ({pci}): {int(xid)}, {XID_TEXT.get(int(xid), 'Unknown Error')}")
            if int(xid) in XID_CONDITIONS:  # the report (nvidia-smi -q -x) shows what the Xid left
                self._add_condition(gpu, XID_CONDITIONS[int(xid)])
            return {"gpu": index, "xid": int(xid)}

    def degrade_gpu(self, index: int, condition: str) -> dict:
        """The GPU stays visible and its processes run, but its report shows `condition` (one of
        nvsmi_xml.CONDITIONS: pending_retired_pages, hw_slowdown, ...) until recover_gpu or reset.
        """
        if condition not in CONDITIONS:
            raise ValueError(f"unknown GPU condition {condition!r}; known: {', '.join(CONDITIONS)}")
        with self._lock:
            gpu = self._gpu(index)
            self._add_condition(gpu, condition)
            self.record_truth("fault", op="degrade_gpu", gpu=index, condition=condition)
            return {"gpu": index, "conditions": list(gpu.conditions)}

    def recover_gpu(self, index: int) -> dict:
        with self._lock:
            gpu = self._gpu(index)
            gpu.lost, gpu.xid, gpu.conditions = False, None, ()
            self.kernel.add(f"NVRM: GPU {gpu.short_bus_id}: GPU recovered after reset.")
            return {"gpu": index}

    def unload_driver(self) -> dict:
        """The NVIDIA kernel module is gone: nvidia-smi fails (exit 9), GPU processes die."""
        with self._lock:
            self.driver_loaded = False
            victims = [j for j in self.jobs.values() if j.alive and j.gpus]
            for job in victims:
                job.signal_group(signal.SIGKILL)
            self.kernel.add("nvidia-nvlink: Unregistered Nvlink Core, major device number 236")
            return {"killed": [j.pid for j in victims]}

    def load_driver(self) -> dict:
        with self._lock:
            self.driver_loaded = True
            self.kernel.add("nvidia-nvlink: Nvlink Core is being initialized, major device number 236")
            return {}

    def power_off(self) -> dict:
        """The host goes dark: its job processes die and SSH refuses connections until power_on."""
        with self._lock:
            self.powered = False
            t_ns = time.monotonic_ns()
            killed = self._kill_all()
        self.record_truth("fault", t_ns, op="power_off", pids=killed)
        if self.on_power is not None:
            self.on_power(False)
        return {"killed": killed}

    def power_on(self) -> dict:
        with self._lock:
            was = self.powered
            self.powered = True
            if not was:
                self.kernel = self._boot_log()
        if self.on_power is not None:
            self.on_power(True)
        return {}

    def straggle(
        self, pid: int | None = None, job: str | None = None, duty: float = 0.5, period_ms: float = 200.0
    ) -> dict:
        """Slow a job down: each period it runs for duty*period, then sits SIGSTOPped for the rest."""
        if not 0.0 < duty <= 1.0 or period_ms <= 0:
            raise ValueError(f"need 0 < duty <= 1 and period_ms > 0, got duty={duty}, period_ms={period_ms}")
        targets = self._select(pid, job)
        for j in targets:
            self._stop_straggle(j)
            if duty >= 1.0:
                continue
            stop = threading.Event()
            j.straggle = stop
            self.record_truth("fault", op="straggle", pids=[j.pid], duty=duty, period_ms=period_ms)
            threading.Thread(
                target=_duty_cycle, args=(j, stop, duty, period_ms / 1000), name=f"straggle-{j.pid}", daemon=True
            ).start()
        return {"pids": [j.pid for j in targets], "duty": duty, "period_ms": period_ms}

    def stop_straggle(self, pid: int | None = None, job: str | None = None) -> dict:
        targets = self._select(pid, job, required=False)
        for j in targets:
            self._stop_straggle(j)
        return {"pids": [j.pid for j in targets]}

    def reset(self) -> dict:
        """Back to the initial state: no jobs, healthy GPUs, driver loaded, powered, empty home."""
        with self._lock:
            killed = self._kill_all()
            self.jobs.clear()
            for g in self.gpus:
                g.lost, g.xid, g.conditions = False, None, ()
            self.driver_loaded = True
            self.kernel = self._boot_log()
        for child in self.home.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        self.power_on()
        return {"killed": killed}

    def state(self) -> dict:
        with self._lock:
            return {
                "name": self.spec.name,
                "powered": self.powered,
                "driver_loaded": self.driver_loaded,
                "home": str(self.home),
                "gpus": [
                    {"index": g.index, "uuid": g.uuid, "lost": g.lost, "xid": g.xid, "conditions": list(g.conditions)}
                    for g in self.gpus
                ],
                "jobs": [
                    {
                        "pid": j.pid,
                        "job": j.name,
                        "argv": j.argv,
                        "gpus": j.gpus,
                        "log": j.log,
                        "alive": j.alive,
                        "returncode": j.returncode,
                        "straggling": j.straggle is not None and not j.straggle.is_set(),
                    }
                    for j in self.jobs.values()
                ],
            }

    def close(self) -> None:
        with self._lock:
            self._kill_all()

    # --- internals -----------------------------------------------------------------------------

    def _add_condition(self, gpu: Gpu, condition: str) -> None:
        if condition not in gpu.conditions:
            gpu.conditions = (*gpu.conditions, condition)

    def _gpu(self, index: int) -> Gpu:
        if not 0 <= int(index) < len(self.gpus):
            raise ValueError(f"GPU index {index} out of range: {self.spec.name} has GPUs 0..{len(self.gpus) - 1}")
        return self.gpus[int(index)]

    def _select(self, pid: int | None, job: str | None, required: bool = True) -> list[Job]:
        with self._lock:
            live = [j for j in self.jobs.values() if j.alive]
        if pid is not None:
            chosen = [j for j in live if j.pid == int(pid)]
        elif job is not None:
            chosen = [j for j in live if j.name == job]
        else:
            chosen = [] if required else live
        if required and not chosen:
            known = ", ".join(f"{j.pid} ({j.name or '-'})" for j in live) or "none"
            raise ValueError(f"no live job with pid={pid} job={job!r} on {self.spec.name} (live jobs: {known})")
        return chosen

    def _stop_straggle(self, job: Job) -> None:
        if job.straggle is not None:
            job.straggle.set()
            job.straggle = None
        job.signal_group(signal.SIGCONT)

    def _kill_all(self) -> list[int]:
        for ended in self.subshells.values():
            ended.set()
        victims = [j for j in self.jobs.values() if j.alive]
        for j in victims:
            if j.straggle is not None:
                j.straggle.set()
            j.signal_group(signal.SIGKILL)
        for j in victims:
            try:
                j.returncode = j.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        return [j.pid for j in victims]

    def _boot_log(self) -> KernelLog:
        log = KernelLog()
        uptime = 1234.5 + random.Random(f"{self.spec.seed}:{self.spec.name}:boot").random() * 100
        log.boot -= uptime
        log.boot_wall -= uptime
        step = 0.0
        for line in BOOT_LINES:
            step += 0.8
            log.lines.append((step, line))
        return log


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", errors="replace")


def _copy_gpu(g: Gpu) -> Gpu:
    return dataclasses.replace(g)


def _visible(value: str | None, count: int) -> list[int]:
    """GPU indices a process uses: CUDA_VISIBLE_DEVICES (indices), or GPU 0 when it is unset."""
    if value is None:
        return [0] if count else []
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count and int(part) not in out:
            out.append(int(part))
    return out


def job_state(job: Job) -> str | None:
    """A job's process state as the host's tools read it: the kernel's, except that a process that has exited
    is shown sleeping (S) until all it wrote is in its log file (joblog.py).
    """
    state = _proc_state(job.pid)
    return "S" if state in ("Z", "X") and not job.flushed.is_set() else state


def job_stat(job: Job, line: bytes) -> bytes:
    """The kernel's /proc/PID/stat line of a job's process, with the state job_state shows."""
    head, sep, rest = line.rpartition(b") ")
    state = job_state(job)
    if not sep or state is None or rest[:1] == state.encode():
        return line
    return head + sep + state.encode() + rest[1:]


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, T, Z, ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _duty_cycle(job: Job, stop: threading.Event, duty: float, period: float) -> None:
    try:
        while not stop.is_set():
            job.signal_group(signal.SIGCONT)
            if stop.wait(duty * period):
                break
            job.signal_group(signal.SIGSTOP)
            if stop.wait((1 - duty) * period):
                break
    finally:
        job.signal_group(signal.SIGCONT)
