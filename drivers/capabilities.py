"""What a device can do, as small typing.Protocols (in the manner of bluesky's protocols.py).

The runner and the procedures depend on these, never on a concrete driver class, so a lab can
plug in its own driver for the same kind of device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Identity:
    """What `*IDN?` (or the device's equivalent) says about itself."""

    vendor: str
    model: str
    serial: str
    firmware: str


@runtime_checkable
class CircuitSwitch(Protocol):
    """An optical circuit switch: ingress ports 1..N, egress ports N+1..N+M.

    A circuit is an (ingress, egress) pair. `connect` and `disconnect` return once the switch has
    accepted the command; `wait_settled` returns once the mirrors have stopped moving (light can flow).
    With check=False they do not read the device's error queue; call `check_errors` later (a timed
    change sends its commands back to back, waits for the switch, then checks once).
    """

    def identify(self) -> Identity:
        """Vendor, model, serial and firmware, as the switch reports them."""

    def size(self) -> tuple[int, int]:
        """(ingress ports, egress ports)."""

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        """Add the (ingress, egress) circuits; returns once the switch accepted them (not settled)."""

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        """Remove the (ingress, egress) circuits; returns once the switch accepted the command."""

    def check_errors(self, after: str = ...) -> None:
        """Raise DeviceCommandError if the switch holds errors from writes sent with check=False
        (`after` names them in the message).
        """

    def disconnect_all(self) -> None:
        """Remove every circuit."""

    def wait_settled(self) -> None:
        """Return once the mirrors have stopped moving (light can flow on the circuits made)."""

    def connections(self) -> dict[int, int]:
        """{ingress: egress} for every circuit the switch holds now."""

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        """dBm measured on each of the ports."""

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        """Take the ports out of service (False) or back (True); a write, as PortControl says."""

    def port_states(self, ports: Iterable[int]) -> Mapping[int, str]:
        """Each port's state: "E" (enabled), "D" (disabled) or "F" (failed)."""


@runtime_checkable
class PortControl(Protocol):
    """A switch whose ports can be taken out of service and back (the `link.down` fault kind): a disabled
    port carries no light, whatever circuit it is part of; its circuits stay.

    `set_port_enabled(ports, False)` disables (Polatis SCPI `PORT:DIS`, TL1 `OPR-PORT-SHUTTER`, Calient
    `ED-PORT ...:INAS|OUTAS=OOS`, NETCONF `port-set-state/port-disab`), True enables again; it is a write
    (the interlocks check its ports). `port_states` reads "E" (enabled), "D" (disabled) or "F" (failed).
    Every CircuitSwitch driver of this project has both; a driver without them makes link.down refuse,
    naming the driver.
    """

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        """Take the ports out of service (False) or back into it (True); their circuits stay."""

    def port_states(self, ports: Iterable[int]) -> Mapping[int, str]:
        """Each port's state: "E" (enabled), "D" (disabled) or "F" (failed)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi reports it. A lost GPU ("Unable to determine the device handle") has
    lost=True, its bus id, and its index if the driver saw it healthy before (else -1).
    """

    index: int
    name: str
    uuid: str
    bus_id: str
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    lost: bool = False


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (nvidia-smi --query-compute-apps)."""

    pid: int
    name: str
    gpu_uuid: str
    used_memory_mib: float | None = None


@dataclass(frozen=True)
class JobHandle:
    """A job started in the background on a host: its process (group leader) id and its log file."""

    host: str
    name: str
    pid: int
    log: str  # path on the host (relative to the login directory unless absolute)
    workdir: str


@dataclass(frozen=True)
class JobStatus:
    """state: "running", "stopped" (SIGSTOPped / hung) or "exited"; progress: the last capture of the job's
    progress pattern in the log tail (e.g. the step number), None if it has not matched yet.
    """

    pid: int
    state: str
    progress: str | None
    last_line: str | None


@dataclass(frozen=True)
class WatchEvent:
    """What a watch on a running job reports, timestamped (time.monotonic_ns) when it reached this machine
    (a line: when the packet that completed it arrived, not when a thread got round to reading it):
    "progress" (a log line matching the progress pattern; step: its number), "line" (any other log line),
    "idle" (nothing arrived for one heartbeat; lets the watcher check its timeouts), "gone" (the host saw the
    job's process end; its log's last lines may follow), "exited" (the watch is over: the process is gone and
    its log read to the end). Every watch ends with "gone" then, after any last lines, "exited".
    """

    kind: str
    line: str | None
    step: int | None
    monotonic_ns: int


@runtime_checkable
class GpuHost(Protocol):
    """A Linux GPU server: nvidia-smi, background jobs (one process group each), signals.

    `watch` follows a job's log on one persistent channel and reports progress lines and the process's
    exit as they happen; `health` is a one-shot probe: GPUs (lost ones too), kernel Xid lines, ok.
    """

    def identify(self) -> Identity:
        """The host as its GPUs describe it: vendor, model (count and GPU name), serial (the hostname),
        firmware (the GPU driver's version).
        """

    def gpus(self) -> list[GpuInfo]:
        """Every GPU as nvidia-smi lists it."""

    def processes(self) -> list[GpuProcess]:
        """The processes running on the GPUs."""

    def run_job(
        self,
        command: list[str],
        *,
        name: str,
        gpus: list[int] | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> JobHandle:
        """Start `command` in the background as a process group of its own, its output to a log on the
        host; `gpus` sets CUDA_VISIBLE_DEVICES. Returns the job's handle (its pid and log).
        """

    def job_status(self, job: JobHandle, progress: str | None = None, tail_lines: int = 50) -> JobStatus:
        """Whether the job's process still runs, and its latest progress (`progress` matched on the log's
        last `tail_lines` lines).
        """

    def tail(self, path: str, lines: int = 50) -> str:
        """The last `lines` lines of a file on the host (a job's log)."""

    def signal(self, pid: int, sig: str = "TERM", *, group: bool = True) -> None:
        """Send `sig` to the job's whole process group (group=True) or to the one process."""

    def stop_job(self, job: JobHandle, grace_s: float = 5.0) -> str:
        """SIGTERM the job's process group, SIGKILL after `grace_s`; "not running", "terminated" or
        "killed".
        """

    def kernel_xids(self) -> list[str]:
        """The kernel log's `NVRM: Xid` lines (GPU faults the driver reported)."""

    def watch(
        self, job: JobHandle, *, heartbeat_s: float = 0.05, progress: str | None = ..., lines: int | None = 0
    ) -> Iterable[WatchEvent]:
        """The job's progress lines and its exit, as they happen, on one persistent channel; a heartbeat
        event every `heartbeat_s` while nothing else happens.
        """

    def health(self) -> dict:
        """One probe: the GPUs (lost ones too), the kernel's Xid lines, and `ok`."""


@runtime_checkable
class PhotonicMesh(Protocol):
    """A programmable photonic chip used as a circuit switch: inputs 1..N, outputs N+1..2N.

    Heaters are 0-based. `program` routes a permutation (perm[i] = output index 0-based, or circuits
    {input: output}) with bar/cross cell states through the chip's calibration and returns those states;
    `circuits` reads the heaters back. Drive values are in the chip's native unit (mA or V).
    """

    def identify(self) -> Identity:
        """Vendor, model, serial and firmware, as the chip's controller reports them."""

    def size(self) -> tuple[int, int]:
        """(inputs, outputs): N and N."""

    def heater_count(self) -> int:
        """How many heaters (phase shifters) the chip has."""

    def program(self, permutation: Sequence[int] | Mapping[int, int]) -> list[int]:
        """Route a permutation through the chip's calibration; the bar/cross state of every cell."""

    def circuits(self) -> dict[int, int]:
        """{input: output} that the heaters hold now, read back and decoded."""

    def set_drive(self, heater: int, value: float) -> None:
        """Drive one heater, in the chip's native unit (mA or V)."""

    def read_drive(self, heater: int) -> float:
        """One heater's drive as the controller reads it back, in the chip's native unit."""

    def output_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """dBm on each output port (N+1..2N); every output when `ports` is None."""
