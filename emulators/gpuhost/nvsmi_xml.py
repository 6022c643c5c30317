"""`nvidia-smi -q -x`: the XML report, generated from the emulated GPUs' state in the layout a real driver 580
prints (tests/gpuhost/fixtures/h200-nvidia-smi-q.xml, an H200's), with the parts a health check reads: ECC
counts, retired pages, remapped rows, clocks event reasons, persistence, power, temperature, the NVLink fabric.

A GPU's health conditions (Gpu.conditions, set by the host's degrade_gpu op or an Xid it raised) show as a
real GPU's report shows them: "Yes" under pending_retirement, an uncorrectable DRAM count, "Active" under
clocks_event_reason_hw_slowdown, ...
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

from emulators.gpuhost.nvsmi import (
    DRIVER_GONE,
    RC_DRIVER_NOT_LOADED,
    RC_GPU_LOST,
    RC_NOT_FOUND,
    Gpu,
    View,
    _lost_line,
    _used,
    _util,
)

HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
CUDA_VERSION = "12.4"
# The conditions a GPU can be put in (GpuHostEngine.degrade_gpu), as a health check names them.
CONDITIONS = (
    "pending_retired_pages",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "uncorrected_ecc",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
# Xids that leave a mark in the report (the GPU survives them): the condition each sets.
XID_CONDITIONS = {
    48: "uncorrected_ecc",  # double bit ECC error
    63: "remapped_rows_pending",  # row remapping pending a reset
    64: "remapped_rows_failure",  # row remapping failed
    94: "uncorrected_ecc",  # contained ECC error
    95: "uncorrected_ecc",  # uncontained ECC error
}
REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


REPORT_ARGS = {"-q", "--query", "-x", "--xml-format", "-qx", "-xq"}


def asks_for_report(argv: list[str]) -> bool:
    """Whether `nvidia-smi ARGV` asks for the -q report (answered here, not by nvsmi.nvidia_smi)."""
    return any(arg in REPORT_ARGS for arg in argv)


def nvidia_smi_report(argv: list[str], view: View) -> tuple[str, str, int]:
    """`nvidia-smi -q -x` against the view: (stdout, stderr, exit code). A lost GPU's line comes first (exit 15)
    and the report lists the others; the driver gone and no GPUs fail as nvsmi.nvidia_smi does.
    """
    flags = "".join(sorted(arg.lstrip("-")[0] for arg in argv if arg in REPORT_ARGS))
    if set(argv) - REPORT_ARGS or "q" not in flags or "x" not in flags:
        usage = "The emulated nvidia-smi prints its -q report as XML only, for every GPU: give -q -x."
        return f"{usage}\n\nPlease run 'nvidia-smi -h' for help.\n\n", "", 2
    if not view.driver_loaded:
        return DRIVER_GONE, "", RC_DRIVER_NOT_LOADED
    if not view.gpus:
        return "No devices were found\n", "", RC_NOT_FOUND
    lost = "".join(_lost_line(g) for g in view.gpus if g.lost)
    return lost + report(view, view.gpus), "", RC_GPU_LOST if lost else 0


def report(view: View, gpus: list[Gpu]) -> str:
    """The XML report of the GPUs nvidia-smi can reach (a lost one is left out: the caller prints its line)."""
    root = ET.Element("nvidia_smi_log")
    _leaf(root, "timestamp", time.strftime("%a %b %d %H:%M:%S %Y"))
    _leaf(root, "driver_version", gpus[0].driver_version if gpus else "")
    _leaf(root, "cuda_version", CUDA_VERSION)
    _leaf(root, "attached_gpus", str(len(view.gpus)))
    for g in gpus:
        if not g.lost:
            root.append(_gpu(view, g))
    ET.indent(root, space="\t")
    return HEADER + ET.tostring(root, encoding="unicode") + "\n"


def _gpu(view: View, g: Gpu) -> ET.Element:
    busy = bool(_util(view, g))
    has = set(g.conditions)
    el = ET.Element("gpu", id=g.bus_id)
    _leaf(el, "product_name", g.name)
    _leaf(el, "persistence_mode", "Enabled")
    _leaf(el, "serial", g.serial)
    _leaf(el, "uuid", g.uuid)
    _leaf(el, "minor_number", str(g.index))
    _leaf(el, "gpu_recovery_action", "Reset" if has & {"remapped_rows_pending", "pending_retired_pages"} else "None")
    _group(el, "pci", pci_bus_id=g.bus_id)
    _leaf(el, "performance_state", "P0")
    slowed = has & {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
    reasons = {r: (r == "gpu_idle" and not busy) or r in slowed for r in REASONS}
    if "hw_thermal_slowdown" in has or "hw_power_brake_slowdown" in has:
        reasons["hw_slowdown"] = True  # the driver reports HW slowdown beside its cause
    _group(
        el,
        "clocks_event_reasons",
        **{f"clocks_event_reason_{r}": "Active" if on else "Not Active" for r, on in reasons.items()},
    )
    used = _used(view, g)
    _group(el, "fb_memory_usage", total=f"{g.memory_mib} MiB", used=f"{used} MiB", free=f"{g.memory_mib - used} MiB")
    _group(el, "utilization", gpu_util=f"{_util(view, g)} %", memory_util=f"{40 if busy else 0} %")
    _group(el, "ecc_mode", current_ecc="Enabled", pending_ecc="Enabled")
    dram_unc = "1" if "uncorrected_ecc" in has else "0"
    errors = _group(el, "ecc_errors")
    for scope in ("volatile", "aggregate"):
        _group(
            errors,
            scope,
            sram_correctable="0",
            sram_uncorrectable_parity="0",
            sram_uncorrectable_secded="0",
            dram_correctable="0",
            dram_uncorrectable=dram_unc,
        )
    retired = _group(el, "retired_pages")
    _group(retired, "multiple_single_bit_retirement", retired_count="0", retired_pagelist="")
    _group(retired, "double_bit_retirement", retired_count="1" if "pending_retired_pages" in has else "0")
    pending = "Yes" if "pending_retired_pages" in has else "No"
    _leaf(retired, "pending_blacklist", pending)
    _leaf(retired, "pending_retirement", pending)
    _group(
        el,
        "remapped_rows",
        remapped_row_corr="0",
        remapped_row_unc="1" if has & {"remapped_rows_pending", "remapped_rows_failure"} else "0",
        remapped_row_pending="Yes" if "remapped_rows_pending" in has else "No",
        remapped_row_failure="Yes" if "remapped_rows_failure" in has else "No",
    )
    temp = g.base_temp + (35 if busy else 0) + (50 if "hw_thermal_slowdown" in has else 0)
    _group(el, "temperature", gpu_temp=f"{temp} C", memory_temp=f"{temp + 2} C")
    draw = (610.0 if busy else 71.5) + g.index * 0.37
    _group(
        el,
        "gpu_power_readings",
        power_state="P0",
        average_power_draw=f"{draw:.2f} W",
        instant_power_draw=f"{draw + 0.5:.2f} W",
        current_power_limit="700.00 W",
    )
    _group(el, "clocks", graphics_clock=f"{1980 if busy and not slowed else 345} MHz")
    _group(el, "fabric", state="N/A", status="N/A")
    processes = _group(el, "processes")
    for app in view.apps:
        if app.gpu == g.index:
            _group(
                processes,
                "process_info",
                pid=str(app.pid),
                type="C",
                process_name=app.process_name,
                used_memory=f"{app.used_memory_mib} MiB",
            )
    return el


def _leaf(parent: ET.Element, tag: str, text: str) -> ET.Element:
    el = ET.SubElement(parent, tag)
    el.text = text
    return el


def _group(parent: ET.Element, tag: str, **children: str) -> ET.Element:
    el = ET.SubElement(parent, tag)
    for child, text in children.items():
        _leaf(el, child, text)
    return el
