"""What the GPU-host driver reads from nvidia-smi and the kernel log (drivers/gpuhost/telemetry.py), on the text
alone: CSV rows, nvidia-smi's failures, its exit status behind a mark, Xid lines.
"""

from __future__ import annotations

import pytest

from drivers.capabilities import GpuInfo, GpuProcess, Identity
from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.gpuhost.reply import BadReply
from drivers.gpuhost.telemetry import (
    STATUS_MARK,
    bus_key,
    read_gpus,
    read_identity,
    read_processes,
    smi_output,
    split_status,
    xid_codes,
    xid_lines,
)

GPU0 = "0, NVIDIA H100 80GB HBM3, GPU-aaaa, 00000000:18:00.0, 81559, 1024, 97, 61, 512.25"
GPU1 = "1, NVIDIA H100 80GB HBM3, GPU-bbbb, 00000000:2A:00.0, 81559, [N/A], N/A, [Not Supported], 71.50"
LOST1 = "Unable to determine the device handle for GPU 0000:2A:00.0: Unknown Error"


def test_a_gpu_row_becomes_a_gpu_info_and_unreported_fields_are_none():
    gpus = read_gpus(f"{GPU1}\n{GPU0}\n\n", {})
    assert gpus == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-aaaa", "00000000:18:00.0", 81559.0, 1024.0, 97.0, 61.0, 512.25),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", "GPU-bbbb", "00000000:2A:00.0", 81559.0, None, None, None, 71.5),
    ]


def test_a_lost_gpu_keeps_the_index_it_had_while_healthy():
    known: dict[str, int] = {}
    read_gpus(f"{GPU0}\n{GPU1}\n", known)
    gpus = read_gpus(f"{GPU0}\n{LOST1}\n", known)
    assert gpus[1] == GpuInfo(1, "", "", "0000:2A:00.0", lost=True)


def test_a_gpu_lost_before_it_was_seen_has_index_minus_one_and_sorts_last():
    gpus = read_gpus(f"{LOST1}\n{GPU0}\n", {})
    assert [(g.index, g.lost) for g in gpus] == [(0, False), (-1, True)]


def test_bus_ids_of_either_width_name_the_same_gpu():
    assert bus_key("00000000:2a:00.0") == bus_key("0000:2A:00.0 ") == "2A:00.0"


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("0, NVIDIA H100, oops", "expected 9 fields, got 3"),
        (GPU0.replace("81559", "lots"), "could not convert string to float"),
        ("x" + GPU0[1:], "invalid literal for int()"),
    ],
)
def test_an_unreadable_gpu_row_is_a_protocol_error_caused_by_what_failed(row, why):
    with pytest.raises(BadReply) as err:
        read_gpus(f"{GPU0}\n{row}\n", {})
    bad = err.value
    assert bad.error is DeviceProtocolError
    assert bad.message.startswith(f"cannot parse nvidia-smi's CSV row {row!r}: ") and why in bad.message
    assert "format the driver does not know" in bad.hint
    assert isinstance(bad.__cause__, ValueError)


def test_compute_processes_skip_the_no_process_line_and_lost_gpus():
    text = f"4242, testbed-train, 30000, GPU-aaaa\nNo running processes found\n{LOST1}\n\n77, python, [N/A], GPU-bbbb\n"
    assert read_processes(text) == [
        GpuProcess(4242, "testbed-train", "GPU-aaaa", 30000.0),
        GpuProcess(77, "python", "GPU-bbbb", None),
    ]


@pytest.mark.parametrize("row", ["4242, testbed-train", "pid, testbed-train, 1, GPU-aaaa"])
def test_an_unreadable_process_row_is_a_protocol_error(row):
    with pytest.raises(BadReply) as err:
        read_processes(row + "\n")
    assert err.value.error is DeviceProtocolError
    assert err.value.message.startswith(f"cannot parse nvidia-smi's compute-apps row {row!r}")


def test_identity_counts_the_gpus_and_ignores_lost_ones():
    listing = f"550.54.15, NVIDIA H100 80GB HBM3\n{LOST1}\n550.54.15, NVIDIA H100 80GB HBM3\n"
    assert read_identity("gpu01\n", listing) == Identity("NVIDIA", "2x NVIDIA H100 80GB HBM3", "gpu01", "550.54.15")


@pytest.mark.parametrize("listing", ["", f"{LOST1}\n", "550.54.15\n"])
def test_identity_without_a_gpu_row_is_a_protocol_error(listing):
    with pytest.raises(BadReply) as err:
        read_identity("gpu01", listing)
    assert (err.value.error, err.value.message) == (DeviceProtocolError, "nvidia-smi listed no GPU")


def test_the_exit_status_is_read_from_behind_its_mark():
    out = f"{GPU0}\n{STATUS_MARK} 15\n[  1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1\n"
    assert split_status(out) == (f"{GPU0}\n", 15, "[  1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1\n")


@pytest.mark.parametrize("out", [f"{GPU0}\n", f"{GPU0}\n{STATUS_MARK} \n", f"{STATUS_MARK} ²\n", f"{STATUS_MARK} -1\n"])
def test_output_without_an_exit_status_is_a_protocol_error_naming_the_shell(out):
    with pytest.raises(BadReply) as err:
        split_status(out)
    assert err.value.error is DeviceProtocolError and "POSIX shell" in err.value.hint


def test_a_listing_with_a_lost_gpu_is_still_a_listing():
    assert smi_output(f"{GPU0}\n{LOST1}\n", "", 15) == f"{GPU0}\n{LOST1}\n"
    assert smi_output(f"{GPU0}\n", "", 0) == f"{GPU0}\n"


def test_no_devices_found_is_an_empty_listing():
    assert smi_output("No devices were found\n", "", 6) == ""


@pytest.mark.parametrize(
    "said",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "Failed to initialize NVML: Driver/library version mismatch",
    ],
)
def test_a_driver_nvidia_smi_cannot_reach_is_a_command_error_with_its_words(said):
    with pytest.raises(BadReply) as err:
        smi_output(said + "\n", "", 9)
    bad = err.value
    assert bad.error is DeviceCommandError
    assert bad.message == f"nvidia-smi cannot reach the NVIDIA driver (exit status 9): {said}"
    assert "dmesg | grep NVRM" in bad.hint


def test_any_other_failure_is_a_command_error_with_the_exit_status_and_stderr():
    with pytest.raises(BadReply) as err:
        smi_output("", "bash: nvidia-smi: command not found\n", 127)
    assert err.value.message == "nvidia-smi failed with exit status 127: bash: nvidia-smi: command not found"
    assert "127 means nvidia-smi is not on the PATH" in err.value.hint


def test_a_lost_gpu_line_does_not_excuse_another_exit_status():
    with pytest.raises(BadReply):
        smi_output(f"{LOST1}\n", "", 2)


def test_xid_lines_and_their_distinct_codes():
    log = (
        "[    0.000000] Linux version 6.1.0\n"
        "[ 1204.5] NVRM: Xid (PCI:0000:5d:00): 79, pid=4242, GPU has fallen off the bus.\n"
        "[ 1300.1] NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception\n"
        "[ 1301.1] NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception\n"
        "[ 1302.0] NVRM: GPU at PCI:0000:18:00: GPU-aaaa\n"
    )
    lines = xid_lines(log)
    assert len(lines) == 3 and all("NVRM: Xid" in line for line in lines)
    assert xid_codes(lines) == [13, 79]
    assert xid_codes(["NVRM: Xid without its parts"]) == []
