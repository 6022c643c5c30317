"""drivers/gpuhost/smi_xml.py on a real H200's `nvidia-smi -q -x` (fixtures/h200-nvidia-smi-q.xml), and on the
states a lab meets, each built by editing that real report: pending retired pages, a hardware slowdown or power
brake, the older clocks_throttle_reasons spelling, an NVLink fabric, several GPUs, and reports it must refuse.
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from drivers.errors import DeviceProtocolError
from drivers.gpuhost.reply import BadReply
from drivers.gpuhost.smi_xml import CONDITIONS, EccErrors, Fabric, RemappedRows, RetiredPages, read_report

REAL = (Path(__file__).parent / "fixtures" / "h200-nvidia-smi-q.xml").read_text()
HEADER = REAL[: REAL.index("<nvidia_smi_log>")]  # the XML declaration and nvidia-smi's DOCTYPE


def edited(*edits) -> str:
    """The real report with each edit(gpu element, root) applied to its one GPU, as nvidia-smi would print it."""
    root = ET.fromstring(REAL[len(HEADER) :])
    for edit in edits:
        edit(root.find("gpu"), root)
    return HEADER + ET.tostring(root, encoding="unicode")


def setting(path: str, text: str):
    def edit(gpu: ET.Element, root: ET.Element) -> None:
        gpu.find(path).text = text

    return edit


def test_the_real_h200_report_reads_as_the_machine_was():
    report = read_report(REAL)
    assert (report.driver_version, report.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = report.gpus
    assert gpu.bus_id == "00000000:00:06.0"
    assert (gpu.name, gpu.uuid, gpu.serial) == (
        "NVIDIA H200",
        "GPU-44737255-d097-e114-40a1-6109f289457d",
        "1653824070105",
    )
    assert (gpu.minor_number, gpu.persistence_mode, gpu.pstate) == (0, True, "P0")
    assert (gpu.temperature_c, gpu.memory_temperature_c) == (34.0, 36.0)
    assert (gpu.power_draw_w, gpu.power_limit_w) == (78.49, 700.0)  # average, as --query-gpu=power.draw: 78.48 W
    assert gpu.recovery_action is None  # "None": nothing asked
    assert gpu.ecc == EccErrors("Enabled", 0, 0, 0, 0)
    assert gpu.retired_pages == RetiredPages(None, None, None)  # Hopper remaps rows instead: all N/A
    assert gpu.remapped_rows == RemappedRows(0, 0, False, False)
    assert gpu.clocks_event_reasons == {
        "gpu_idle": True,
        "applications_clocks_setting": False,
        "sw_power_cap": False,
        "hw_slowdown": False,
        "hw_thermal_slowdown": False,
        "hw_power_brake_slowdown": False,
        "sync_boost": False,
        "sw_thermal_slowdown": False,
        "display_clocks_setting": False,
    }
    assert gpu.fabric == Fabric(None, None, None)  # a PCIe card: no NVLink fabric
    assert gpu.conditions() == []  # an idle GPU is healthy


def test_pending_retired_pages_are_a_condition_in_either_spelling():
    pages = [setting("retired_pages/double_bit_retirement/retired_count", "2")]
    newer = read_report(edited(*pages, setting("retired_pages/pending_retirement", "Yes"))).gpus[0]
    assert newer.retired_pages == RetiredPages(None, 2, True)
    assert newer.conditions() == ["pending_retired_pages"]
    # An older driver fills in only pending_blacklist (pending_retirement N/A, as here, or absent).
    older = read_report(edited(*pages, setting("retired_pages/pending_blacklist", "Yes"))).gpus[0]
    assert older.retired_pages.pending is True and older.conditions() == ["pending_retired_pages"]
    settled = read_report(edited(setting("retired_pages/pending_retirement", "No"))).gpus[0]
    assert settled.retired_pages.pending is False and settled.conditions() == []


def test_remapped_rows_pending_and_failed_are_conditions():
    gpu = read_report(
        edited(
            setting("remapped_rows/remapped_row_unc", "3"),
            setting("remapped_rows/remapped_row_pending", "Yes"),
            setting("remapped_rows/remapped_row_failure", "Yes"),
        )
    ).gpus[0]
    assert gpu.remapped_rows == RemappedRows(0, 3, True, True)
    assert gpu.conditions() == ["remapped_rows_pending", "remapped_rows_failure"]


def test_uncorrected_ecc_counts_sum_sram_and_dram_and_only_volatile_ones_are_a_condition():
    gpu = read_report(
        edited(
            setting("ecc_errors/volatile/dram_uncorrectable", "2"),
            setting("ecc_errors/volatile/sram_uncorrectable_parity", "1"),
            setting("ecc_errors/aggregate/dram_uncorrectable", "5"),
            setting("ecc_errors/aggregate/sram_correctable", "7"),
        )
    ).gpus[0]
    assert gpu.ecc == EccErrors("Enabled", 3, 5, 0, 7)
    assert gpu.conditions() == ["uncorrected_ecc"]
    lifetime = read_report(edited(setting("ecc_errors/aggregate/dram_uncorrectable", "5"))).gpus[0]
    assert lifetime.ecc.aggregate_uncorrected == 5 and lifetime.conditions() == []  # since the driver loaded: none


def test_a_hardware_slowdown_or_power_brake_is_a_condition_a_power_cap_is_not():
    reason = "clocks_event_reasons/clocks_event_reason_"
    slowed = read_report(
        edited(setting(reason + "hw_slowdown", "Active"), setting(reason + "hw_power_brake_slowdown", "Active"))
    ).gpus[0]
    assert slowed.conditions() == ["hw_slowdown", "hw_power_brake_slowdown"]
    thermal = read_report(edited(setting(reason + "hw_thermal_slowdown", "Active"))).gpus[0]
    assert thermal.conditions() == ["hw_thermal_slowdown"]
    capped = read_report(edited(setting(reason + "sw_power_cap", "Active"))).gpus[0]
    assert capped.clocks_event_reasons["sw_power_cap"] is True and capped.conditions() == []


def test_the_older_clocks_throttle_reasons_spelling_reads_the_same():
    def older_spelling(gpu: ET.Element, root: ET.Element) -> None:
        reasons = gpu.find("clocks_event_reasons")
        reasons.tag = "clocks_throttle_reasons"
        for child in reasons:
            child.tag = child.tag.replace("clocks_event_reason_", "clocks_throttle_reason_")
        reasons.find("clocks_throttle_reason_hw_slowdown").text = "Active"

    gpu = read_report(edited(older_spelling)).gpus[0]
    assert gpu.clocks_event_reasons["hw_slowdown"] is True and gpu.clocks_event_reasons["gpu_idle"] is True
    assert gpu.conditions() == ["hw_slowdown"]


def test_an_nvlink_fabric_reads_and_a_gpu_out_of_it_is_a_condition():
    joined = read_report(
        edited(
            setting("fabric/state", "Completed"),
            setting("fabric/status", "Success"),
            setting("fabric/health/summary", "Healthy"),
        )
    ).gpus[0]
    assert joined.fabric == Fabric("Completed", "Success", "Healthy") and joined.conditions() == []
    training = read_report(edited(setting("fabric/state", "In Progress"))).gpus[0]
    assert training.conditions() == ["nvlink_fabric"]
    failed = read_report(edited(setting("fabric/state", "Completed"), setting("fabric/status", "Failure"))).gpus[0]
    assert failed.conditions() == ["nvlink_fabric"]

    def no_fabric(gpu: ET.Element, root: ET.Element) -> None:  # an older driver has no fabric section at all
        gpu.remove(gpu.find("fabric"))

    assert read_report(edited(no_fabric)).gpus[0].fabric == Fabric(None, None, None)


def test_several_gpus_each_with_their_own_readings_in_order():
    def three_gpus(gpu: ET.Element, root: ET.Element) -> None:
        for n, bus in ((1, "00000000:00:07.0"), (2, "00000000:00:08.0")):
            other = copy.deepcopy(gpu)
            other.set("id", bus)
            other.find("pci/pci_bus_id").text = bus
            other.find("minor_number").text = str(n)
            root.append(other)
        root.findall("gpu")[2].find("remapped_rows/remapped_row_pending").text = "Yes"
        root.find("attached_gpus").text = "3"

    report = read_report(edited(three_gpus))
    assert [(g.bus_id, g.minor_number) for g in report.gpus] == [
        ("00000000:00:06.0", 0),
        ("00000000:00:07.0", 1),
        ("00000000:00:08.0", 2),
    ]
    assert [g.conditions() for g in report.gpus] == [[], [], ["remapped_rows_pending"]]


def test_a_lost_gpus_line_before_the_report_is_skipped():
    lost = "Unable to determine the device handle for GPU0000:00:07.0: Unknown Error\n"
    assert [g.bus_id for g in read_report(lost + REAL).gpus] == ["00000000:00:06.0"]


def test_every_condition_has_what_to_do():
    assert all(detail and ":" in detail for detail in CONDITIONS.values())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "does not parse"),
        ("No devices were found", "does not parse"),
        (REAL[: len(REAL) // 2], "does not parse"),
        ("<?xml version='1.0' ?><nvidia_smi_log><gpu>", "does not parse"),
        ("<?xml version='1.0' ?><smi/>", "not <nvidia_smi_log>"),
        ("<?xml version='1.0' ?><nvidia_smi_log><gpu><product_name>x</product_name></gpu></nvidia_smi_log>", "no bus"),
        (edited(setting("remapped_rows/remapped_row_pending", "Maybe")), "<remapped_rows/remapped_row_pending>"),
        (edited(setting("ecc_errors/volatile/dram_uncorrectable", "-1")), "holds '-1', not a count"),
        (edited(setting("temperature/gpu_temp", "hot")), "not a number with its unit"),
        (edited(setting("persistence_mode", "On")), "'Enabled' or 'Disabled'"),
    ],
)
def test_a_report_the_parser_cannot_read_is_a_protocol_error_saying_what(text, message):
    with pytest.raises(BadReply) as bad:
        read_report(text)
    assert bad.value.error is DeviceProtocolError
    assert message in bad.value.message and bad.value.hint


@pytest.mark.parametrize(
    "doctype",
    [
        '<!DOCTYPE nvidia_smi_log [<!ENTITY x "boom">]>',  # an entity declaration (the billion laughs' start)
        '<!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file:///etc/passwd">]>',  # an external entity
    ],
)
def test_entities_are_refused_not_expanded(doctype):
    text = f'<?xml version="1.0" ?>\n{doctype}\n<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>'
    with pytest.raises(BadReply) as bad:
        read_report(text)
    assert bad.value.error is DeviceProtocolError and "refused" in bad.value.message
    assert "boom" not in bad.value.message and "root:" not in bad.value.message
