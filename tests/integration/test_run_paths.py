"""Other ways a run goes: the switch on its serial console, an interrupted run, and what Ray listens on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.cli.main import main


def serial_inventory(repo: Path, tmp_path: Path) -> Path:
    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    text = text.replace(
        'transport: {type: visa, resource: "TCPIP0::192.0.2.10::5025::SOCKET", timeout_ms: 2000}',
        "transport: {type: serial, port: /dev/ttyUSB0, baudrate: 38400, timeout_ms: 2000}",
    )
    assert "type: serial, port: /dev/ttyUSB0, baudrate: 38400" in text
    path = tmp_path / "serial-rack.yaml"
    path.write_text(text)
    return path


def test_emulated_run_over_the_serial_console(ray_cluster, repo, tmp_path, capsys):
    inventory = serial_inventory(repo, tmp_path)
    code = main(
        [
            "run",
            str(repo / "playbooks/ocs-reconfig.yaml"),
            "--emulate",
            "--trials",
            "2",
            "--inventory",
            str(inventory),
            "--results",
            str(tmp_path / "results"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    run_dir = Path(out.strip().splitlines()[-1].removeprefix("results: "))
    audit = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    # The real serial transport (pyserial) spoke to the twin's raw pseudo-terminal.
    assert {a["address"] for a in audit} == {
        json.loads((run_dir / "run.json").read_text())["twin"]["devices"]["ocs1"]["serial"]
    }
    assert all(a["address"].startswith("/dev/pts/") for a in audit)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spans"]["reconfig.ack"]["n"] == 6


def test_ctrl_c_aborts_cleanly_and_runs_teardown(ray_cluster, repo, tmp_path):
    address = ray_cluster.get_runtime_context().gcs_address
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed",
            "run",
            "playbooks/ocs-reconfig.yaml",
            "--emulate",
            "--trials",
            "100000",
            "--results",
            str(results),
            "--ray-address",
            address,
        ],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Interrupt once the run is demonstrably in its trials: a trial has ended in the event log.
        events_file = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(results.glob("*/events.jsonl"))
            if found and '"op": "trial.end"' in found[0].read_text():
                events_file = found[0]
                break
            time.sleep(0.05)  # polling the file the run writes, not a stand-in for an event
        assert events_file is not None, proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    run_dir = events_file.parent
    assert out.strip().splitlines()[-1] == f"results: {run_dir}"
    lines = events_file.read_text().splitlines()
    events = [json.loads(line) for line in lines]  # every line whole: nothing torn
    assert json.loads((run_dir / "run.json").read_text())["status"] == "aborted"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "aborted"
    assert any(e["op"] == "run.aborted" for e in events)
    closes = [e for e in events if e.get("device") == "ocs1" and e["type"] in ("ok", "fail", "info")]
    assert closes[-1]["op"] == "ocs.connections" and closes[-1]["type"] == "ok"  # final read-back
    assert closes[-2]["op"] == "ocs.clear" and closes[-2]["type"] == "ok"  # teardown restored the fabric


def test_local_ray_listens_on_loopback_only(ray_cluster):
    """Every listening socket of the Ray processes of this machine is bound to 127.0.0.1."""
    ray_pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(name in cmd for name in ("gcs_server", "raylet", "ray::", "default_worker.py")):
            ray_pids.append(pid)
    assert ray_pids
    inodes = set()
    for pid in ray_pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                listening.append(fields[1].split(":")[0])
    assert listening
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    assert set(listening) <= loopback, listening
