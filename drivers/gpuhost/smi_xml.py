"""Reading `nvidia-smi -q -x`, the XML report, into plain typed readings per GPU: what a lab checks beyond the
CSV listing (ECC, retired pages, remapped rows, clocks event reasons, persistence, the NVLink fabric, ...).

A pure function of the text, like the CSV readers in telemetry.py: it raises BadReply, which the driver turns
into the DeviceError naming the host, the command and its output. Parsed with defusedxml: the report's own
DOCTYPE (nvidia-smi names its DTD) is allowed, entity declarations and external references are refused.
The reference output is tests/gpuhost/fixtures/h200-nvidia-smi-q.xml (a real H200, driver 580).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from drivers.errors import DeviceProtocolError
from drivers.gpuhost.reply import BadReply

XML_HINT = "this nvidia-smi prints an XML report the driver does not read; report it with `nvidia-smi -q -x`'s output"
# What a field holds when this GPU or driver does not report it.
ABSENT = ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "None")
# The report calls the reasons a GPU's clocks are held down clocks_event_reasons since driver 535;
# older drivers clocks_throttle_reasons (each child prefixed alike).
REASON_SPELLINGS = ("clocks_event_reasons", "clocks_throttle_reasons")
_REASON_PREFIX = re.compile(r"^clocks?_(event|throttle)_reason_")
_MEASURE = re.compile(r"^(-?[0-9]+(?:\.[0-9]+)?)(?:\s*\S+)?$")  # "34 C", "78.49 W", "0 us", "143771 MiB"

# What a health check calls a GPU's condition, and what a lab does about it. Hardware slowdowns are the
# reasons a GPU cannot run at speed whatever the job does (the SW ones, a power cap or idle, are policy).
CONDITIONS = {
    "pending_retired_pages": "memory pages wait to be retired: reset the GPU (or reboot) to retire them",
    "remapped_rows_pending": "a row remapping waits for a GPU reset: reset the GPU (or reboot)",
    "remapped_rows_failure": "row remapping failed: the GPU has run out of spare rows; have it replaced",
    "uncorrected_ecc": "uncorrected ECC errors since the driver loaded: drain the GPU and reset it",
    "hw_slowdown": "clocks held down by a hardware slowdown (thermal or power): check cooling and power supply",
    "hw_thermal_slowdown": "clocks held down by a hardware thermal slowdown: check the GPU's cooling",
    "hw_power_brake_slowdown": "clocks held down by the power brake (an external signal): check the power supply",
    "nvlink_fabric": "the GPU is not in the NVLink fabric: check the Fabric Manager and the NVSwitches",
}
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class EccErrors:
    """Uncorrected (and corrected) ECC error counts: volatile since the driver loaded, aggregate over the
    GPU's life. None where the GPU does not count them (ECC off, or not supported).
    """

    mode: str | None  # "Enabled" / "Disabled"
    volatile_uncorrected: int | None
    aggregate_uncorrected: int | None
    volatile_corrected: int | None
    aggregate_corrected: int | None


@dataclass(frozen=True)
class RetiredPages:
    """Page retirement (pre-Ampere GPUs; N/A, so None, on those that remap rows instead)."""

    single_bit: int | None
    double_bit: int | None
    pending: bool | None  # pending_blacklist (older drivers) or pending_retirement


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping (Ampere and later): counts of remapped rows, and whether one waits or failed."""

    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


@dataclass(frozen=True)
class Fabric:
    """The NVLink fabric (NVSwitch systems: state "Completed", status "Success" once the GPU joined it, "In
    Progress" while the Fabric Manager trains its links). A PCIe card has no NVLink: every field None. The XML
    report has no per-link state; `nvidia-smi nvlink -s` lists the links.
    """

    state: str | None
    status: str | None
    health: str | None  # the fabric health summary


@dataclass(frozen=True)
class GpuReading:
    """One GPU as the XML report describes it."""

    bus_id: str
    name: str | None
    uuid: str | None
    serial: str | None
    minor_number: int | None
    persistence_mode: bool | None
    pstate: str | None
    temperature_c: float | None
    memory_temperature_c: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    recovery_action: str | None  # what the driver asks for ("None" is read as None): a reset, a reboot, ...
    ecc: EccErrors
    retired_pages: RetiredPages
    remapped_rows: RemappedRows
    clocks_event_reasons: dict[str, bool]  # reason (hw_slowdown, sw_power_cap, ...) -> active
    fabric: Fabric

    def conditions(self) -> list[str]:
        """The conditions of CONDITIONS this GPU is in, in that order."""
        found = {
            "pending_retired_pages": self.retired_pages.pending is True,
            "remapped_rows_pending": self.remapped_rows.pending is True,
            "remapped_rows_failure": self.remapped_rows.failure is True,
            "uncorrected_ecc": bool(self.ecc.volatile_uncorrected),
            **{reason: self.clocks_event_reasons.get(reason, False) for reason in HW_REASONS},
            "nvlink_fabric": self.fabric.state not in (None, "Completed")
            or self.fabric.status not in (None, "Success"),
        }
        return [name for name in CONDITIONS if found[name]]


@dataclass(frozen=True)
class SmiReport:
    """The whole report: the driver's and CUDA's versions, and the GPUs nvidia-smi reached, in its order."""

    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuReading]


def read_report(text: str) -> SmiReport:
    """The report `nvidia-smi -q -x` printed. Anything before the XML declaration (a lost GPU's "Unable to
    determine the device handle" line) is skipped; the GPUs listed are the ones nvidia-smi could reach.
    """
    start = text.find("<?xml")
    document = text[start:] if start >= 0 else text
    try:
        root = SafeET.fromstring(document, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as exc:
        raise BadReply(
            DeviceProtocolError,
            f"nvidia-smi's XML report declares entities or external references, which it never does: refused ({exc})",
            hint="check what runs as nvidia-smi on the host (`command -v nvidia-smi`)",
        ) from exc
    except (ET.ParseError, ValueError) as exc:  # ValueError: a declared encoding that does not fit a str
        raise BadReply(DeviceProtocolError, f"nvidia-smi's XML report does not parse: {exc}", hint=XML_HINT) from exc
    if root.tag != "nvidia_smi_log":
        raise BadReply(
            DeviceProtocolError, f"nvidia-smi's XML report is <{root.tag}>, not <nvidia_smi_log>", hint=XML_HINT
        )
    return SmiReport(_text(root, "driver_version"), _text(root, "cuda_version"), [_gpu(g) for g in root.findall("gpu")])


def _gpu(el: ET.Element) -> GpuReading:
    bus_id = el.get("id") or _text(el, "pci/pci_bus_id")
    if not bus_id:
        raise BadReply(DeviceProtocolError, "a <gpu> of nvidia-smi's XML report has no bus id", hint=XML_HINT)
    try:
        return GpuReading(
            bus_id=bus_id,
            name=_text(el, "product_name"),
            uuid=_text(el, "uuid"),
            serial=_text(el, "serial"),
            minor_number=_int(el, "minor_number"),
            persistence_mode=_flag(el, "persistence_mode", {"Enabled": True, "Disabled": False}),
            pstate=_text(el, "performance_state"),
            temperature_c=_measure(el, "temperature/gpu_temp"),
            memory_temperature_c=_measure(el, "temperature/memory_temp"),
            power_draw_w=_power(el, DRAW),
            power_limit_w=_power(el, LIMIT),
            recovery_action=_text(el, "gpu_recovery_action"),
            ecc=_ecc(el),
            retired_pages=RetiredPages(
                single_bit=_int(el, "retired_pages/multiple_single_bit_retirement/retired_count"),
                double_bit=_int(el, "retired_pages/double_bit_retirement/retired_count"),
                pending=_pending_retirement(el),
            ),
            remapped_rows=RemappedRows(
                correctable=_int(el, "remapped_rows/remapped_row_corr"),
                uncorrectable=_int(el, "remapped_rows/remapped_row_unc"),
                pending=_yes_no(el, "remapped_rows/remapped_row_pending"),
                failure=_yes_no(el, "remapped_rows/remapped_row_failure"),
            ),
            clocks_event_reasons=_reasons(el),
            fabric=Fabric(_text(el, "fabric/state"), _text(el, "fabric/status"), _text(el, "fabric/health/summary")),
        )
    except _BadField as bad:
        raise BadReply(
            DeviceProtocolError,
            f"GPU {bus_id} in nvidia-smi's XML report: <{bad.path}> holds {bad.value!r}, not {bad.wanted}",
            hint=XML_HINT,
        ) from None


class _BadField(Exception):
    def __init__(self, path: str, value: str, wanted: str) -> None:
        super().__init__(path)
        self.path, self.value, self.wanted = path, value, wanted


def _text(el: ET.Element, path: str) -> str | None:
    """The field's text, stripped; None where it is missing or the GPU does not report it ("N/A")."""
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ABSENT else text


def _int(el: ET.Element, path: str) -> int | None:
    text = _text(el, path)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise _BadField(path, text, "a count")
    return int(text)


def _measure(el: ET.Element, path: str) -> float | None:
    text = _text(el, path)
    if text is None:
        return None
    m = _MEASURE.match(text)
    if m is None:
        raise _BadField(path, text, "a number with its unit")
    return float(m.group(1))


def _power(el: ET.Element, paths: tuple[str, ...]) -> float | None:
    """The first of the paths the report fills in: drivers since 535 put power under gpu_power_readings
    (average_power_draw, as --query-gpu=power.draw reads it, since 550), older ones under power_readings.
    """
    for path in paths:
        value = _measure(el, path)
        if value is not None:
            return value
    return None


DRAW = ("gpu_power_readings/average_power_draw", "gpu_power_readings/power_draw", "power_readings/power_draw")
LIMIT = ("gpu_power_readings/current_power_limit", "power_readings/power_limit")


def _flag(el: ET.Element, path: str, words: dict[str, bool]) -> bool | None:
    text = _text(el, path)
    if text is None:
        return None
    if text not in words:
        raise _BadField(path, text, " or ".join(repr(w) for w in words))
    return words[text]


def _yes_no(el: ET.Element, path: str) -> bool | None:
    return _flag(el, path, {"Yes": True, "No": False})


def _pending_retirement(el: ET.Element) -> bool | None:
    # Both spellings are in the report (the older pending_blacklist kept beside pending_retirement).
    now = _yes_no(el, "retired_pages/pending_retirement")
    return now if now is not None else _yes_no(el, "retired_pages/pending_blacklist")


def _ecc(el: ET.Element) -> EccErrors:
    return EccErrors(
        mode=_text(el, "ecc_mode/current_ecc"),
        volatile_uncorrected=_ecc_sum(el, "volatile", uncorrected=True),
        aggregate_uncorrected=_ecc_sum(el, "aggregate", uncorrected=True),
        volatile_corrected=_ecc_sum(el, "volatile", uncorrected=False),
        aggregate_corrected=_ecc_sum(el, "aggregate", uncorrected=False),
    )


def _ecc_sum(el: ET.Element, scope: str, *, uncorrected: bool) -> int | None:
    """The scope's count: Hopper and later list sram_/dram_ (un)correctable counts; older GPUs give a total
    under double_bit (uncorrected) and single_bit (corrected). None when nothing is counted (N/A).
    """
    base = f"ecc_errors/{scope}"
    older = _int(el, f"{base}/{'double_bit' if uncorrected else 'single_bit'}/total")
    if older is not None:
        return older
    node = el.find(base)
    if node is None:
        return None
    counts = [
        _int(node, child.tag)
        for child in node
        if "correctable" in child.tag and ("uncorrectable" in child.tag) == uncorrected
    ]
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _reasons(el: ET.Element) -> dict[str, bool]:
    for spelling in REASON_SPELLINGS:
        node = el.find(spelling)
        if node is not None:
            return {
                _REASON_PREFIX.sub("", child.tag): flag
                for child in node
                if (flag := _flag(node, child.tag, {"Active": True, "Not Active": False})) is not None
            }
    return {}
