"""What every benchmark shares: percentiles, the machine it ran on, process memory from /proc, quiet
consoles, and where raw results go (bench/out/, git-ignored)."""

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

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"


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
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the field after the state; comm may hold spaces


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
    the descendants of `ancestor` if given (this process's own Ray instance, not another user's)."""
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
    reading. Use as a context manager around the run."""

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
        served) the PSS of all of them per device."""
        rss = [m["rss_kib"] / 1024 for m in self.peak.values() if m.get("rss_kib")]
        pss = [m["pss_kib"] / 1024 for m in self.peak.values() if m.get("pss_kib")]
        return {
            "actors_seen": len(self.peak),
            "rss_mib_p50": float(np.median(rss)) if rss else None,
            "pss_mib_p50": float(np.median(pss)) if pss else None,
            "devices": devices,
            "pss_mib_per_device": sum(pss) / devices if pss and devices else None,
        }
