"""What nvidia-smi and the kernel log say, read into the GpuHost capability's types.

Pure functions of the text a host printed; they run nothing. Text they cannot read, and nvidia-smi's own
reports of failure, raise BadReply (drivers/gpuhost/reply.py).
"""

from __future__ import annotations

import re

from drivers.capabilities import GpuInfo, GpuProcess, Identity
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.gpuhost.reply import BadReply

GPU_QUERY = "index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw"
GPUS_ARGS = f"--query-gpu={GPU_QUERY} --format=csv,noheader,nounits"
APP_QUERY = "pid,process_name,used_memory,gpu_uuid"
IDENTITY_QUERY = "nvidia-smi --query-gpu=driver_version,name --format=csv,noheader"
LOST = re.compile(r"Unable to determine the device handle for (?:GPU|gpu )?\s*([0-9A-Fa-f:.]+)")
DRIVER_FAILURES = ("NVIDIA-SMI has failed", "Failed to initialize NVML", "couldn't communicate with the NVIDIA driver")
# Separates nvidia-smi's output and exit status from what a compound command printed after it.
STATUS_MARK = "--testbed-nvidia-smi-status--"
XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
SMI_FORMAT_HINT = "this nvidia-smi prints a format the driver does not know; report it with the output"


def bus_key(bus_id: str) -> str:
    """'00000000:2A:00.0' and '0000:2A:00.0' name the same GPU: compare on BUS:DEV.FN, upper case."""
    return bus_id.strip().upper()[-7:]


def number(text: str) -> float | None:
    """A CSV cell's value; None for a field this GPU does not report ('[N/A]', 'N/A', '[Not Supported]')."""
    text = text.strip()
    if text.startswith("[") or text in ("", "N/A"):
        return None
    return float(text.split()[0])


def split_status(out: str) -> tuple[str, int, str]:
    """(nvidia-smi's output, its exit status, what followed) from `out`, a compound command's output in
    which `echo STATUS_MARK $?` followed nvidia-smi.
    """
    smi_out, found, rest = out.partition(f"{STATUS_MARK} ")
    status, _, after = rest.partition("\n")
    if not found or not status.strip().isascii() or not status.strip().isdigit():
        raise BadReply(
            DeviceProtocolError,
            f"the output lacks nvidia-smi's exit status ({STATUS_MARK} N)",
            hint="the host's login shell must be a POSIX shell (bash, dash) for `;` and `$?`",
        )
    return smi_out, int(status), after


def smi_output(stdout: str, stderr: str, status: int) -> str:
    """What nvidia-smi listed, given its output and exit status: "" when it found no device.

    Exit status 15 with a lost GPU's line is a listing (the other GPUs' rows are there); a driver that
    cannot be reached, or any other failure, raises BadReply.
    """
    text = stdout + stderr
    if status == 0 or (status == 15 and LOST.search(text)):
        return stdout
    if any(f in text for f in DRIVER_FAILURES):
        raise BadReply(
            DeviceCommandError,
            f"nvidia-smi cannot reach the NVIDIA driver (exit status {status}): {text.strip()[:300]}",
            hint="the driver is not loaded or mismatches the library (after an update: reboot or reload the "
            "nvidia modules); `dmesg | grep NVRM` on the host shows why",
        )
    if "No devices were found" in text:
        return ""
    raise BadReply(
        DeviceCommandError,
        f"nvidia-smi failed with exit status {status}: {text.strip()[:300]}",
        hint="127 means nvidia-smi is not on the PATH of a non-interactive login; 2 means this nvidia-smi "
        "does not know a queried field (driver too old?)",
    )


def read_identity(hostname: str, listing: str) -> Identity:
    """The host as IDENTITY_QUERY's rows (driver version, GPU name) and its hostname describe it."""
    rows = [line.split(", ") for line in listing.splitlines() if line and not LOST.search(line)]
    if not rows or len(rows[0]) < 2:
        raise BadReply(DeviceProtocolError, "nvidia-smi listed no GPU", hint=SMI_FORMAT_HINT)
    version, name = rows[0][0], rows[0][1]
    return Identity(vendor="NVIDIA", model=f"{len(rows)}x {name}", serial=hostname.strip(), firmware=version)


def read_gpus(listing: str, known: dict[str, int]) -> list[GpuInfo]:
    """The GPUs of GPUS_ARGS' rows, by index, lost ones last unless `known` has their index.

    `known` maps bus_key(bus id) to index: every healthy GPU read is entered in it, so a GPU that is lost
    later (nvidia-smi then prints only its bus id) keeps its index.
    """
    out: list[GpuInfo] = []
    for line in listing.splitlines():
        if not line.strip():
            continue
        lost = LOST.search(line)
        if lost:
            bus = lost.group(1).rstrip(":")
            out.append(GpuInfo(known.get(bus_key(bus), -1), "", "", bus, lost=True))
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
                memory_total_mib=number(cells[4]),
                memory_used_mib=number(cells[5]),
                utilization_pct=number(cells[6]),
                temperature_c=number(cells[7]),
                power_w=number(cells[8]),
            )
        except ValueError as exc:
            raise BadReply(
                DeviceProtocolError, f"cannot parse nvidia-smi's CSV row {line!r}: {exc}", hint=SMI_FORMAT_HINT
            ) from exc
        known[bus_key(gpu.bus_id)] = gpu.index
        out.append(gpu)
    return sorted(out, key=lambda g: (g.index < 0, g.index))


def read_processes(listing: str) -> list[GpuProcess]:
    """The compute processes of APP_QUERY's rows."""
    out = []
    for line in listing.splitlines():
        if not line.strip() or LOST.search(line) or line.startswith("No running"):
            continue
        cells = [c.strip() for c in line.split(", ")]
        try:
            out.append(GpuProcess(int(cells[0]), cells[1], cells[3], number(cells[2])))
        except (ValueError, IndexError) as exc:
            raise BadReply(
                DeviceProtocolError,
                f"cannot parse nvidia-smi's compute-apps row {line!r}: {exc}",
                hint=SMI_FORMAT_HINT,
            ) from exc
    return out


def xid_lines(kernel_log: str) -> list[str]:
    """The kernel log's `NVRM: Xid` lines: a GPU's driver reporting an error."""
    return [line for line in kernel_log.splitlines() if "NVRM: Xid" in line]


def xid_codes(lines: list[str]) -> list[int]:
    """The distinct Xid numbers of those lines, in order."""
    return sorted({int(m.group(1)) for line in lines if (m := XID.search(line))})
