"""The GPU host driver's detailed health (`nvidia-smi -q -x`, drivers/gpuhost/smi_xml.py) against the emulated host
over its SSH endpoint: the emulator's report, generated from its state, reads with the parser a real H200's report
reads with; a GPU put in a condition (degrade_gpu, or an Xid that leaves one) is named in the probe's conditions.
And against a scripted host (ssh_scripted.py) that prints the real H200's report, or a garbled one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ssh_scripted import ScriptedSsh

from drivers.errors import DeviceProtocolError
from drivers.gpuhost import GpuHostSsh
from drivers.transports.ssh import SshTransport
from testbed.families.drivers import make_driver

REAL_XML = (Path(__file__).parent / "fixtures" / "h200-nvidia-smi-q.xml").read_text()
# The same machine's --query-gpu row (the reference's h200-misc.txt), in the driver's listing's fields.
H200_ROW = "0, NVIDIA H200, GPU-44737255-d097-e114-40a1-6109f289457d, 00000000:00:06.0, 143771, 0, 0, 34, 78.48\n"
STATUS = "--testbed-nvidia-smi-status--"


@pytest.fixture
def driver(settings):
    audit = []
    drv = make_driver("ssh", "gpu01", settings, audit.append)
    drv.audit_records = audit
    yield drv
    drv.close()


def test_the_emulators_report_reads_as_its_gpus_are(driver, gpu_host):
    report = driver.gpu_report()
    assert report.driver_version == "550.54.15"
    state = gpu_host.state()["gpus"]
    assert [g.uuid for g in report.gpus] == [g["uuid"] for g in state]
    assert [g.bus_id for g in report.gpus] == [g.bus_id for g in driver.gpus()]
    gpu = report.gpus[1]
    assert (gpu.name, gpu.persistence_mode, gpu.pstate, gpu.power_limit_w) == (
        "NVIDIA H100 80GB HBM3",
        True,
        "P0",
        700.0,
    )
    assert gpu.ecc.volatile_uncorrected == 0 and gpu.remapped_rows.pending is False
    assert gpu.clocks_event_reasons["gpu_idle"] is True and not gpu.clocks_event_reasons["hw_slowdown"]
    assert [g.conditions() for g in report.gpus] == [[], [], [], []]


def test_a_healthy_host_has_readings_and_no_conditions_in_one_exec(driver):
    probe = driver.health(details=True)
    assert probe["ok"] and probe["conditions"] == [] and probe["readings_error"] is None
    assert [r["index"] for r in probe["readings"]] == [0, 1, 2, 3]  # by bus id, from the listing
    assert probe["readings"][2]["bus_id"] == probe["gpus"][2]["bus_id"] == "00000000:3A:00.0"
    tx = [r.data for r in driver.audit_records if r.direction == "tx"]
    assert len(tx) == 1 and " ; nvidia-smi -q -x ; echo --testbed-nvidia-smi-status-- $? ; dmesg" in tx[0]
    assert "readings" not in driver.health()  # the plain probe (a detection loop's) stays the quick one


@pytest.mark.parametrize(
    "condition",
    ["pending_retired_pages", "remapped_rows_pending", "remapped_rows_failure", "uncorrected_ecc", "hw_slowdown"],
)
def test_a_degraded_gpu_is_named_in_the_conditions_and_the_host_is_not_ok(driver, gpu_host, condition):
    gpu_host.degrade_gpu(2, condition)
    probe = driver.health(details=True)
    assert not probe["ok"] and probe["lost"] == [] and probe["xids"] == []  # nothing else says so
    assert [(p["gpu"], p["bus_id"], p["condition"]) for p in probe["conditions"]] == [
        (2, "00000000:3A:00.0", condition)
    ]
    assert probe["conditions"][0]["detail"]
    gpu_host.recover_gpu(2)
    assert driver.health(details=True)["conditions"] == []


def test_a_power_brake_shows_as_a_hardware_slowdown_and_its_cause(driver, gpu_host):
    gpu_host.degrade_gpu(0, "hw_power_brake_slowdown")
    conditions = driver.health(details=True)["conditions"]
    assert [(p["gpu"], p["condition"]) for p in conditions] == [(0, "hw_slowdown"), (0, "hw_power_brake_slowdown")]


def test_an_xid_for_row_remapping_leaves_it_pending_in_the_report(driver, gpu_host):
    gpu_host.raise_xid(1, xid=63)
    probe = driver.health(details=True)
    assert probe["xid_codes"] == [63]
    assert [(p["gpu"], p["condition"]) for p in probe["conditions"]] == [(1, "remapped_rows_pending")]
    assert probe["readings"][1]["recovery_action"] == "Reset"


def test_a_lost_gpu_is_left_out_of_the_report_and_the_rest_read(driver, gpu_host):
    driver.gpus()  # the driver learns bus id -> index while the GPU is healthy
    gpu_host.fail_gpu(3)
    probe = driver.health(details=True)
    assert probe["lost"] == [3] and probe["readings_error"] is None
    assert [r["index"] for r in probe["readings"]] == [0, 1, 2]


def test_a_driver_gone_is_the_listings_error_and_the_reports(driver, gpu_host):
    gpu_host.unload_driver()
    probe = driver.health(details=True)
    assert not probe["ok"] and "exit status 9" in probe["error"]
    assert probe["readings"] == [] and "exit status 9" in probe["readings_error"]


@pytest.mark.parametrize("args", ["-q", "-x", "-q -x -i 0", "-q --query-gpu=index --format=csv"])
def test_the_emulator_prints_the_report_only_as_xml_for_every_gpu(driver, args):
    r = driver.exec(f"nvidia-smi {args}", check=False)
    assert r.status == 2 and "give -q -x" in r.stdout


def test_degrade_gpu_refuses_a_condition_it_does_not_know(gpu_host):
    with pytest.raises(ValueError, match="unknown GPU condition 'melted'; known: pending_retired_pages"):
        gpu_host.degrade_gpu(0, "melted")


def scripted(tmp_path: Path, report: str) -> tuple[GpuHostSsh, ScriptedSsh]:
    """A host whose nvidia-smi lists the real H200 and prints `report` for -q -x."""

    def answer(command: str):
        if command.startswith("nvidia-smi --query-gpu=index") and "-q -x" in command:
            return f"{H200_ROW}{STATUS} 0\n{report}{STATUS} 0\n[    0.000000] Linux version 6.18.44\n", "", 0
        if command == "nvidia-smi -q -x":
            return report, "", 0
        return "", "", 0

    server = ScriptedSsh(answer, tmp_path)
    return GpuHostSsh(SshTransport(server.settings(5.0), "gpu01"), "gpu01"), server


def test_the_real_h200_report_over_ssh_is_a_healthy_probe(tmp_path):
    driver, server = scripted(tmp_path, REAL_XML)
    try:
        probe = driver.health(details=True)
    finally:
        driver.close()
        server.stop()
    assert probe["ok"] and probe["conditions"] == [] and probe["readings_error"] is None
    (reading,) = probe["readings"]
    assert (reading["index"], reading["bus_id"], reading["serial"]) == (0, "00000000:00:06.0", "1653824070105")
    assert reading["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert reading["clocks_event_reasons"]["gpu_idle"] is True


def test_a_garbled_report_is_a_protocol_error_naming_the_host_the_command_and_what_to_do(tmp_path):
    garbled = REAL_XML[: len(REAL_XML) // 3]
    driver, server = scripted(tmp_path, garbled)
    try:
        with pytest.raises(DeviceProtocolError) as err:
            driver.gpu_report()
        probe = driver.health(details=True)
    finally:
        driver.close()
        server.stop()
    assert err.value.device == "gpu01" and err.value.sent == "nvidia-smi -q -x" and err.value.received == garbled
    assert "XML report does not parse" in err.value.message and "nvidia-smi -q -x" in err.value.hint
    # In the health probe it is recorded, and the host's health is what the listing and the kernel say.
    assert probe["ok"] and "XML report does not parse" in probe["readings_error"] and probe["readings"] == []
