"""Record and replay: a real emulated run's audit log replayed through a fresh emulator agrees with every
recorded reply; a reply that differs (as a real device's would) is reported, and only that one.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from testbed.contracts.errors import UserError
from testbed.ops.audit_replay import main, replay_run


@pytest.fixture(scope="module")
def recorded_run(testbed_run, tmp_path_factory) -> Path:
    """A real run of playbooks/ocs-reconfig.yaml on the emulated twin, as a user starts it."""
    results = tmp_path_factory.mktemp("results")
    return testbed_run("playbooks/ocs-reconfig.yaml", "--emulate", "--trials", "2", "--results", str(results))


@pytest.fixture
def run_copy(recorded_run, tmp_path) -> Path:
    """A copy of the run to tamper with."""
    return Path(shutil.copytree(recorded_run, tmp_path / recorded_run.name))


def read_audit(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]


def write_audit(run_dir: Path, records: list[dict]) -> None:
    (run_dir / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def queries(records: list[dict]) -> int:
    return sum(1 for r in records if r["direction"] == "tx" and r["data"].split(" ", 1)[0].rstrip().endswith("?"))


def test_an_emulated_run_replays_with_every_reply_agreeing(recorded_run):
    report = replay_run(recorded_run)
    (ocs,) = report.devices
    assert (ocs.device, ocs.replayed) == ("ocs1", True)
    assert report.compared == queries(read_audit(recorded_run)) > 0  # every query, none skipped
    assert report.agreed == report.compared and report.disagreements == [] and report.ok
    out = io.StringIO()
    assert main(recorded_run, out) == 0
    assert out.getvalue().endswith(
        f"replay: {report.compared} queries compared, {report.compared} agreed (100.0 %), 0 disagreed\n"
    )


def test_a_reply_the_device_gave_differently_is_the_one_disagreement(run_copy):
    records = read_audit(run_copy)
    # The first light reading after the ring was applied: as if the real switch measured -7.25 dBm on
    # its first egress port where the emulator's model says -1.00.
    tx_at = next(n for n, r in enumerate(records) if r["direction"] == "tx" and r["data"].startswith(":PMON:POW?"))
    rx = records[tx_at + 1]
    assert rx["direction"] == "rx"
    original = rx["data"].rstrip("\r\n")
    assert original.startswith("-1.00,")
    rx["data"] = "-7.25," + original.split(",", 1)[1] + "\r\n"
    write_audit(run_copy, records)

    report = replay_run(run_copy)
    (x,) = report.disagreements
    assert x.device == "ocs1"
    assert x.audit_line == tx_at + 1
    assert x.index == sum(1 for r in records[:tx_at] if r["direction"] == "tx")
    assert x.command == records[tx_at]["data"].rstrip("\n")
    assert (x.recorded, x.emulator) == ("-7.25," + original.split(",", 1)[1], original)
    assert (report.compared, report.agreed, report.disagreed) == (queries(records), queries(records) - 1, 1)

    out = io.StringIO()
    assert main(run_copy, out) == 1
    assert f"ocs1 #{x.index} (audit.jsonl:{x.audit_line}) {x.command!r}: device '-7.25," in out.getvalue()


def test_replay_starts_from_the_circuits_the_run_found(run_copy):
    # A switch that already held 5 -> 37 when the run identified it: its replies show that circuit.
    events = [json.loads(line) for line in (run_copy / "events.jsonl").read_text().splitlines()]
    found = next(e for e in events if e["op"] == "fabric.initial")  # what the run recorded it found
    found["data"]["circuits"]["ocs1"] = {"5": 37}
    (run_copy / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    records = read_audit(run_copy)
    ask = next(n for n, r in enumerate(records) if r["data"].startswith(":OXC:SWIT:CONN:STAT?"))
    write_audit(run_copy, [*records[: ask + 1], {**records[ask + 1], "data": "(@5),(@37)\r\n"}])

    report = replay_run(run_copy)
    assert report.ok and report.compared == queries(records[: ask + 1])
    assert "started with the 1 circuit(s) the run found" in report.devices[0].note


def test_devices_without_a_replay_are_reported_not_failed(run_copy):
    records = read_audit(run_copy)
    host = {"device": "gpu01", "address": "lab@127.0.0.1:2222", "mono_ns": records[-1]["mono_ns"] + 1, "wall": 0}
    write_audit(
        run_copy,
        [
            *records,
            {**host, "direction": "tx", "data": "nvidia-smi -L\n"},
            {**host, "direction": "rx", "data": "GPU 0\n"},
        ],
    )
    report = replay_run(run_copy)
    gpu = next(d for d in report.devices if d.device == "gpu01")
    assert (gpu.replayed, gpu.kind, gpu.messages) == (False, "gpu_host", 1)
    assert gpu.note == "not replayable yet (no replay for a gpu_host driven by ssh)"
    assert report.ok
    out = io.StringIO()
    assert main(run_copy, out) == 0
    assert "gpu01: not replayable yet" in out.getvalue()


def test_an_unanswered_opc_is_timing_not_a_disagreement(run_copy):
    # A real switch slower than the transport's timeout: *OPC? never answered in time.
    records = read_audit(run_copy)
    opc = next(n for n, r in enumerate(records) if r["data"] == "*OPC?\n")
    del records[opc + 1]
    write_audit(run_copy, records)
    report = replay_run(run_copy)
    assert report.ok and report.devices[0].timing_only == 1
    assert report.compared == queries(records) - 1


def test_a_folder_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(UserError, match="not a readable run folder"):
        replay_run(tmp_path)
    assert main(tmp_path) == 2
    assert "pass a folder `testbed run` wrote" in capsys.readouterr().err
