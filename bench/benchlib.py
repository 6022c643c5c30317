"""What every benchmark shares: percentiles, the machine it ran on, process memory from /proc, quiet
consoles, and where raw results go (bench/out/, git-ignored).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import numpy as np
from rich.console import Console

from testbed.engine.processes import stat_fields

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
PROJECT_PACKAGES = ("testbed", "drivers", "emulators", "hostside")


def compile_project() -> None:
    """The project's modules compiled to bytecode before anything is timed, so that a timed command starts from
    the state a user's second command does, and Ansible's and Ray's do (pip compiles an installed package's
    modules; Python writes a source tree's on its first import). An editable install has no bytecode until then,
    and none at all where PYTHONDONTWRITEBYTECODE is set, as on this project's bench machine: every command,
    every hub's worker and the twin would compile ~130 modules (~0.2 s of CPU per process, measured).
    """
    import compileall

    for package in PROJECT_PACKAGES:
        if not compileall.compile_dir(REPO / package, quiet=1):
            raise RuntimeError(f"compiling {package} to bytecode failed: run `python -m compileall {package}`")


def pct(samples, q: float) -> float:
    return float(np.percentile(np.asarray(samples, dtype=float), q))


def stats(samples) -> dict:
    """n, min, p50, p99 and max of a list of numbers (whatever unit they are in)."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        return {"n": 0}
    return {
        "n": int(x.size),
        "min": float(x.min()),
        "p50": float(np.percentile(x, 50)),
        "p99": float(np.percentile(x, 99)),
        "max": float(x.max()),
    }


def quiet_console() -> Console:
    return Console(file=open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process


def write_out(name: str, result: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _openssh() -> str | None:
    try:
        r = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stderr or r.stdout).strip() or None


def machine() -> dict:
    mem_kib = None
    try:
        m = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        mem_kib = int(m.group(1)) if m else None
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "ray": _version("ray"),
        "paramiko": _version("paramiko"),
        "ansible_core": _version("ansible-core"),
        "openssh": _openssh(),
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }


# --- memory of processes, from /proc ------------------------------------------------------------------


def memory_kib(pid: int) -> dict:
    """Resident set (VmRSS) and proportional set size (Pss: shared pages split among their users) in KiB."""
    out = {}
    try:
        m = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
        out["rss_kib"] = int(m.group(1)) if m else None
        m = re.search(r"^Pss:\s+(\d+)", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M)
        out["pss_kib"] = int(m.group(1)) if m else None
    except OSError:
        return {}
    return out


def _parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


def descends_from(pid: int, ancestor: int) -> bool:
    while pid not in (0, 1):
        if pid == ancestor:
            return True
        parent = _parent(pid)
        if parent is None:
            return False
        pid = parent
    return False


def processes_titled(prefix: str, ancestor: int | None = None) -> list[int]:
    """Pids whose command line starts with `prefix` (Ray titles an actor's worker `ray::ClassName`), among
    the descendants of `ancestor` if given (this process's own Ray instance, not another user's).
    """
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(prefix.encode()) and (ancestor is None or descends_from(int(entry.name), ancestor)):
            pids.append(int(entry.name))
    return pids


class ActorMemory:
    """Samples the memory of every process titled `prefix` that descends from this one (the workers of the
    Ray instance this process started) once a second while a run goes on; keeps each process's largest
    reading. Use as a context manager around the run.
    """

    def __init__(self, prefix: str = "ray::DeviceHub", every_s: float = 1.0) -> None:
        self.prefix = prefix
        self.every_s = every_s
        self.peak: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="actor-memory", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for pid in processes_titled(self.prefix, ancestor=os.getpid()):
                mem = memory_kib(pid)
                if not mem or mem.get("rss_kib") is None:
                    continue
                best = self.peak.setdefault(pid, mem)
                for key, value in mem.items():
                    if value is not None and (best.get(key) is None or value > best[key]):
                        best[key] = value

    def __enter__(self) -> ActorMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, devices: int | None = None) -> dict:
        """Per hub process: median peak RSS and PSS in MiB, how many were seen, and (given the devices they
        served) the PSS of all of them per device.
        """
        rss = [m["rss_kib"] / 1024 for m in self.peak.values() if m.get("rss_kib")]
        pss = [m["pss_kib"] / 1024 for m in self.peak.values() if m.get("pss_kib")]
        return {
            "actors_seen": len(self.peak),
            "rss_mib_p50": float(np.median(rss)) if rss else None,
            "pss_mib_p50": float(np.median(pss)) if pss else None,
            "devices": devices,
            "pss_mib_per_device": sum(pss) / devices if pss and devices else None,
        }


# --- a whole process tree, sampled from outside (a `testbed run` started as a subprocess) ---------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> dict[int, int]:
    """{pid: parent pid} of `root` and all its living descendants (zombies left out), from one pass over /proc;
    a parent comes before its children.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree = {root: 0} if stat_fields(root) is not None else {}
    todo = [root] if tree else []
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            tree[child] = pid
            todo.append(child)
    return tree


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def mem_available_kib() -> int:
    """The machine's MemAvailable (/proc/meminfo): what can still be given to processes without swapping."""
    return int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class TreeMemory:
    """Samples the memory (Pss from smaps_rollup, VmRSS) of a process and all its descendants every `every_s`
    seconds while it runs, from another process: the way to see what a command such as `testbed run` costs
    as a whole (its Ray instance's processes and the twin are its descendants).

    `classify(pid, command_line)` puts each process in a group (e.g. "controller", "twin", "ray"); a process
    whose parent is in a group of `inherit` is put in its parent's group (the twin's job processes count as
    the twin). Kept: the sample with the largest total PSS (its groups' sums), the largest total RSS, each
    group's largest PSS and RSS sums, each process's largest reading with its group and command line, and
    each process's last CPU time (user + system; a process that ends between two samples loses what it used
    after the last one), and the machine's /proc/meminfo MemAvailable: how far it fell below its value at the
    start (`mem_available_drop_mib`: the tree's share and the kernel's for it, but also anything else running).
    Use as a context manager around the wait for the command.
    """

    def __init__(self, root: int, classify, inherit: tuple[str, ...] = (), every_s: float = 0.5) -> None:
        self.root = root
        self.classify = classify
        self.inherit = inherit
        self.every_s = every_s
        self.samples = 0
        self.peak_pss: dict = {"pss_kib": 0}
        self.peak_rss: dict = {"rss_kib": 0}
        self.group_peaks: dict[str, dict] = {}
        self.procs: dict[int, dict] = {}
        self.mem_available_start_kib = self.mem_available_low_kib = mem_available_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-memory", daemon=True)

    def sample(self) -> None:
        tree = process_tree(self.root)
        total = {"pss_kib": 0, "rss_kib": 0, "processes": 0, "groups": {}}
        groups: dict[int, str] = {}
        for pid, parent in tree.items():  # parents first: a child sees its parent's group
            command = command_line(pid)
            # classified afresh every time: a Ray worker's title changes once it hosts an actor
            inherited = groups.get(parent)
            group = groups[pid] = inherited if inherited in self.inherit else self.classify(pid, command)
            mem = memory_kib(pid)
            if not mem or mem.get("rss_kib") is None or mem.get("pss_kib") is None:
                continue  # gone meanwhile, or a kernel thread
            g = total["groups"].setdefault(group, {"pss_kib": 0, "rss_kib": 0, "processes": 0})
            for d in (total, g):
                d["pss_kib"] += mem["pss_kib"]
                d["rss_kib"] += mem["rss_kib"]
                d["processes"] += 1
            proc = self.procs.setdefault(pid, dict(mem))
            proc["pss_kib"] = max(proc["pss_kib"], mem["pss_kib"])
            proc["rss_kib"] = max(proc["rss_kib"], mem["rss_kib"])
            proc["group"], proc["command"] = group, command[:120]  # the last seen
            cpu = cpu_seconds(pid)
            if cpu is not None:
                proc["cpu_s"] = cpu
        self.samples += 1
        self.mem_available_low_kib = min(self.mem_available_low_kib, mem_available_kib())
        if total["pss_kib"] > self.peak_pss["pss_kib"]:
            self.peak_pss = total
        if total["rss_kib"] > self.peak_rss["rss_kib"]:
            self.peak_rss = total
        for name, g in total["groups"].items():
            peak = self.group_peaks.setdefault(name, {"pss_kib": 0, "rss_kib": 0, "processes": 0})
            for key in peak:
                peak[key] = max(peak[key], g[key])

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mem_available_drop_mib(self) -> float:
        return (self.mem_available_start_kib - self.mem_available_low_kib) / 1024

    def cpu_by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for proc in self.procs.values():
            out[proc["group"]] = out.get(proc["group"], 0.0) + proc.get("cpu_s", 0.0)
        return out

    def processes(self) -> list[dict]:
        """Every process seen, largest PSS first: its group, command line (as last seen), peak PSS and RSS in
        MiB and CPU seconds.
        """
        out = [
            {
                "pid": pid,
                "group": p["group"],
                "command": p["command"],
                "pss_mib": round(p["pss_kib"] / 1024, 1),
                "rss_mib": round(p["rss_kib"] / 1024, 1),
                "cpu_s": round(p.get("cpu_s", 0.0), 2),
            }
            for pid, p in self.procs.items()
        ]
        return sorted(out, key=lambda p: -p["pss_mib"])

    def summary(self) -> dict:
        """Peaks in MiB: the whole tree's PSS and RSS (at their largest samples), each group's largest sums,
        and the CPU seconds each group used.
        """

        def mib(d: dict) -> dict:
            out = {"pss_mib": d.get("pss_kib", 0) / 1024, "rss_mib": d.get("rss_kib", 0) / 1024}
            if "processes" in d:
                out["processes"] = d["processes"]
            return out

        return {
            "samples": self.samples,
            "every_s": self.every_s,
            "peak_pss": {
                **mib(self.peak_pss),
                "groups": {k: mib(v) for k, v in self.peak_pss.get("groups", {}).items()},
            },
            "peak_rss": {
                **mib(self.peak_rss),
                "groups": {k: mib(v) for k, v in self.peak_rss.get("groups", {}).items()},
            },
            "group_peaks": {k: mib(v) for k, v in self.group_peaks.items()},
            "cpu_s": {k: round(v, 2) for k, v in self.cpu_by_group().items()},
        }
