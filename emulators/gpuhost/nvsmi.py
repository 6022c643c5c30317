"""`nvidia-smi` as a pure function of the emulated GPUs (docs/protocols.md §4).

Supported: `--query-gpu=F,...` and `--query-compute-apps=F,...` with `--format=csv[,noheader][,nounits]`,
`-L` / `--list-gpus`, `-i/--id` to select GPUs, and a bare `nvidia-smi` (a short summary); `-q -x`, the XML
report, is nvsmi_xml.py's. Failure outputs: the driver gone (exit 9), a lost GPU ("Unable to determine the
device handle ...", exit 15, the healthy GPUs still listed), an unknown field (exit 2). Like the real tool,
errors go to stdout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

DRIVER_GONE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
    "latest NVIDIA driver is installed and running.\n"
)
RC_INVALID_ARG = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_LOST = 15

# Plausible H100 HGX bus ids; more GPUs continue past them.
BUS_IDS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def bus_number(index: int) -> int:
    return BUS_IDS[index] if index < len(BUS_IDS) else (0xE0 + index) % 256


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    serial: str
    memory_mib: int
    driver_version: str
    base_temp: int = 30
    lost: bool = False
    xid: int | None = None
    conditions: tuple[str, ...] = ()  # health conditions the XML report shows (nvsmi_xml.CONDITIONS)

    @property
    def bus_id(self) -> str:  # as --query-gpu=pci.bus_id prints it
        return f"00000000:{bus_number(self.index):02X}:00.0"

    @property
    def short_bus_id(self) -> str:  # as the "Unable to determine" message and Xid lines print it
        return f"0000:{bus_number(self.index):02X}:00.0"


@dataclass
class App:
    pid: int
    process_name: str
    gpu: int
    used_memory_mib: int
    running: bool = True  # False while SIGSTOPped: the GPU sits idle


@dataclass
class View:
    gpus: list[Gpu]
    apps: list[App] = field(default_factory=list)
    driver_loaded: bool = True


def _util(view: View, g: Gpu) -> int:
    return 97 if any(a.gpu == g.index and a.running for a in view.apps) else 0


def _used(view: View, g: Gpu) -> int:
    return sum(a.used_memory_mib for a in view.apps if a.gpu == g.index)


def _ts() -> str:
    now = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


# field -> (unit or None, value(view, gpu))
GPU_FIELDS: dict[str, tuple[str | None, Callable[[View, Gpu], object]]] = {
    "timestamp": (None, lambda v, g: _ts()),
    "driver_version": (None, lambda v, g: g.driver_version),
    "count": (None, lambda v, g: len(v.gpus)),
    "index": (None, lambda v, g: g.index),
    "name": (None, lambda v, g: g.name),
    "serial": (None, lambda v, g: g.serial),
    "uuid": (None, lambda v, g: g.uuid),
    "pci.bus_id": (None, lambda v, g: g.bus_id),
    "pstate": (None, lambda v, g: "P0" if _util(v, g) else "P0"),
    "temperature.gpu": (None, lambda v, g: g.base_temp + (35 if _util(v, g) else 0)),
    "utilization.gpu": ("%", lambda v, g: _util(v, g)),
    "utilization.memory": ("%", lambda v, g: 40 if _util(v, g) else 0),
    "memory.total": ("MiB", lambda v, g: g.memory_mib),
    "memory.used": ("MiB", lambda v, g: _used(v, g)),
    "memory.free": ("MiB", lambda v, g: g.memory_mib - _used(v, g)),
    "power.draw": ("W", lambda v, g: f"{(610.0 if _util(v, g) else 71.5) + g.index * 0.37:.2f}"),
    "power.limit": ("W", lambda v, g: "700.00"),
    "clocks.sm": ("MHz", lambda v, g: 1980 if _util(v, g) else 345),
    "clocks.max.sm": ("MHz", lambda v, g: 1980),
}
GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "gpu_serial": "serial"}

APP_FIELDS: dict[str, tuple[str | None, Callable[[View, Gpu, App], object]]] = {
    "timestamp": (None, lambda v, g, a: _ts()),
    "pid": (None, lambda v, g, a: a.pid),
    "process_name": (None, lambda v, g, a: a.process_name),
    "name": (None, lambda v, g, a: a.process_name),
    "used_memory": ("MiB", lambda v, g, a: a.used_memory_mib),
    "used_gpu_memory": ("MiB", lambda v, g, a: a.used_memory_mib),
    "gpu_uuid": (None, lambda v, g, a: g.uuid),
    "gpu_bus_id": (None, lambda v, g, a: g.bus_id),
    "gpu_name": (None, lambda v, g, a: g.name),
    "gpu_serial": (None, lambda v, g, a: g.serial),
}


def _lost_line(g: Gpu) -> str:
    return f"Unable to determine the device handle for GPU{g.short_bus_id}: Unknown Error\n"


def _bad_field(name: str) -> tuple[str, str, int]:
    return (
        f'Field "{name}" is not a valid field to query.\n\n',
        "",
        RC_INVALID_ARG,
    )


def _usage(message: str) -> tuple[str, str, int]:
    return f"{message}\n\nPlease run 'nvidia-smi -h' for help.\n\n", "", RC_INVALID_ARG


def _csv(fields: list[str], units: list[str | None], rows: list[list[object]], fmt: set[str]) -> str:
    lines = []
    if "noheader" not in fmt:
        # The header keeps its [unit] even under nounits (docs/protocols.md §4.3: parse headers tolerantly).
        lines.append(", ".join(f"{f} [{u}]" if u else f for f, u in zip(fields, units, strict=True)))
    for row in rows:
        cells = []
        for value, unit in zip(row, units, strict=True):
            text = str(value)
            if unit and "nounits" not in fmt and text not in ("[N/A]", "[Not Supported]"):
                text = f"{text} {unit}"
            cells.append(text)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def nvidia_smi(argv: list[str], view: View) -> tuple[str, str, int]:
    """Run `nvidia-smi ARGV` against the view; returns (stdout, stderr, exit code)."""
    query_gpu = query_apps = fmt = ids = None
    list_gpus = False
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id") and not eq:
            value = next(it, "")
        if key == "--query-gpu":
            query_gpu = value
        elif key == "--query-compute-apps":
            query_apps = value
        elif key == "--format":
            fmt = value
        elif key in ("-i", "--id"):
            ids = value
        elif arg in ("-L", "--list-gpus"):
            list_gpus = True
        elif arg in ("-h", "--help"):
            return "NVIDIA System Management Interface (emulated by testbed)\n", "", 0
        else:
            return _usage(f'Invalid combination of input arguments. Unknown argument "{arg}".')
    if not view.driver_loaded:
        return DRIVER_GONE, "", RC_DRIVER_NOT_LOADED
    if not view.gpus:
        return "No devices were found\n", "", RC_NOT_FOUND
    gpus = view.gpus
    if ids is not None:
        wanted: set[int] = set()
        for part in ids.split(","):
            chosen = [g for g in gpus if part.strip() in (str(g.index), g.uuid, g.bus_id, g.serial)]
            if not chosen:
                return "No devices were found\n", "", RC_NOT_FOUND
            wanted.update(g.index for g in chosen)
        gpus = [g for g in gpus if g.index in wanted]
    lost = [g for g in gpus if g.lost]
    rc = RC_GPU_LOST if lost else 0

    if list_gpus:
        out = "".join(_lost_line(g) if g.lost else f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus)
        return out, "", rc
    if query_gpu is not None or query_apps is not None:
        if fmt is None:
            return _usage("--format must be specified when using --query-gpu or --query-compute-apps.")
        fmt_parts = {p.strip() for p in fmt.split(",")}
        if "csv" not in fmt_parts or not fmt_parts <= {"csv", "noheader", "nounits"}:
            return _usage(f'"{fmt}" is not a valid format. Valid formats: csv[,noheader][,nounits]')
    if query_gpu is not None:
        fields = [f.strip() for f in query_gpu.split(",") if f.strip()]
        resolved = []
        for f in fields:
            canonical = GPU_ALIASES.get(f.lower(), f.lower())
            if canonical not in GPU_FIELDS:
                return _bad_field(f)
            resolved.append(canonical)
        units = [GPU_FIELDS[f][0] for f in resolved]
        out = ""
        if "noheader" not in fmt_parts:
            out += _csv(fields, units, [], fmt_parts)
        for g in gpus:  # the lost GPU's message comes in its place; the healthy ones are still listed
            out += (
                _lost_line(g)
                if g.lost
                else _csv(fields, units, [[GPU_FIELDS[f][1](view, g) for f in resolved]], fmt_parts | {"noheader"})
            )
        return out, "", rc
    if query_apps is not None:
        fields = [f.strip() for f in query_apps.split(",") if f.strip()]
        for f in fields:
            if f.lower() not in APP_FIELDS:
                return _bad_field(f)
        units = [APP_FIELDS[f.lower()][0] for f in fields]
        rows = []
        for app in view.apps:
            on = next((g for g in gpus if g.index == app.gpu), None)
            if on is not None and not on.lost:
                rows.append([APP_FIELDS[f.lower()][1](view, on, app) for f in fields])
        out = "".join(_lost_line(g) for g in lost) + _csv(fields, units, rows, fmt_parts)
        return out, "", rc
    return _summary(view, gpus), "", rc


def _summary(view: View, gpus: list[Gpu]) -> str:
    """A shortened version of the default table: enough for a human glancing at a host."""
    ver = gpus[0].driver_version if gpus else "?"
    lines = [time.strftime("%a %b %d %H:%M:%S %Y"), f"| NVIDIA-SMI {ver}    Driver Version: {ver} |"]
    for g in gpus:
        if g.lost:
            lines.append(_lost_line(g).rstrip())
            continue
        lines.append(
            f"| {g.index:>3}  {g.name:<28} | {g.bus_id} | {_used(view, g):>6}MiB / {g.memory_mib}MiB | "
            f"{_util(view, g):>3}% |"
        )
    lines.append("| Processes: " + ", ".join(f"{a.pid} (GPU {a.gpu}) {a.process_name}" for a in view.apps))
    return "\n".join(lines) + "\n"
