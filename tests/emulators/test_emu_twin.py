"""The twin process: lifecycle, the announced endpoints, and the control API."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from raw_scpi import ask

from emulators.control import TwinControl, TwinControlError
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import Endpoints, TwinProcess, TwinStartError

ROOT = Path(__file__).resolve().parents[2]
SPEC = TwinSpec(
    [
        OcsSpec("ocs1", size=16, jitter_ms=0.0, switching_time_ms=5.0, input_power_dbm={3: -2.0}),
        OcsSpec("ocs2", size=8, idn="Polatis,N-OST-8x8-LU1-DMHNS,000002,6.5.2.18"),
    ]
)


def test_twin_serves_every_device_and_the_control_api():
    with TwinProcess(SPEC) as twin:
        ep = twin.endpoints
        assert isinstance(ep, Endpoints)
        assert sorted(ep.devices) == ["ocs1", "ocs2"]
        for dev in ep.devices.values():
            host, port = dev["tcp"].rsplit(":", 1)
            assert host == "127.0.0.1" and dev["visa"] == f"TCPIP0::127.0.0.1::{port}::SOCKET"
            assert dev["kind"] == "ocs" and dev["serial"].startswith("/dev/pts/")
        assert ask(ep.devices["ocs2"]["tcp"], "*IDN?", ":OXC:SWIT:SIZE?") == [SPEC.devices[1].idn, "8,8"]

        ctl = twin.control
        assert ctl.ping()
        assert ctl.call(None, "endpoints") == ep.to_json()
        ocs1 = ep.devices["ocs1"]["tcp"]
        assert ask(ocs1, ":OXC:SWIT:CONN:ADD (@3),(@20);*OPC?", ":PMON:POW? (@3,20)") == ["1", "-2.00,-3.00"]

        ctl.call("ocs1", "fail_port", port=20)
        assert ask(ocs1, ":PMON:POW? (@3,20)", ":OXC:SWIT:PORT:STAT? (@3,20)") == ["-2.00,-99.99", "(E,F)"]
        state = ctl.call("ocs1", "state")
        assert state["connections"] == [[3, 20]] and state["port_states"]["20"] == "F"
        ctl.call("ocs1", "restore_port", port=20)
        ctl.call("ocs1", "set_input_power", port=3, dbm=-6.5)
        assert ask(ocs1, ":PMON:POW? (@20)") == ["-7.50"]
        ctl.call("ocs1", "reset")
        assert ask(ocs1, ":OXC:SWIT:CONN:STAT?") == ["(@),(@)"]
        assert ctl.call("ocs2", "state")["connections"] == []  # devices do not share state

        for device, op, args, message in [
            ("nope", "reset", {}, "unknown device 'nope'"),
            ("ocs1", "explode", {}, "has no op 'explode'"),
            ("ocs1", "fail_port", {"port": 99}, "out of range"),
            ("ocs1", "fail_port", {"prt": 1}, "unexpected keyword"),
            (None, "dance", {}, "unknown twin op"),
        ]:
            with pytest.raises(TwinControlError, match=message):
                ctl.call(device, op, **args)
        assert ctl.ping()  # errors leave the control connection usable

        proc = twin.process
    assert proc.returncode == 0  # stop() terminated it cleanly


def test_control_server_rejects_malformed_requests():
    with TwinProcess(SPEC) as twin:
        host, port = twin.endpoints.control.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            f = sock.makefile("rwb")
            for raw in [b"not json\n", b"[1,2]\n", b'{"device": "ocs1", "op": "state", "args": 5}\n']:
                f.write(raw)
                f.flush()
                response = json.loads(f.readline())
                assert response["ok"] is False and response["error"]
        # a second client works independently
        with TwinControl(twin.endpoints.control) as other:
            assert other.ping()


def test_twin_exits_when_its_stdin_closes():
    twin = TwinProcess(SPEC)
    twin.start()
    try:
        assert twin.control.ping()
        twin.process.stdin.close()  # what the OS does when the parent dies
        assert twin.process.wait(timeout=10) == 0
    finally:
        twin.stop()


def test_start_failure_reports_the_childs_stderr():
    with pytest.raises(TwinStartError, match="size must be >= 1"):
        TwinProcess(TwinSpec([OcsSpec("broken", size=0)])).start()


def test_command_line_with_a_spec_file(tmp_path):
    spec_file = tmp_path / "twin.json"
    spec_file.write_text(json.dumps(json.loads(SPEC.to_json()), indent=2))  # multi-line JSON is fine
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulators", "serve", str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        announced = json.loads(proc.stdout.readline())
        assert set(announced) == {"control", "devices"}
        assert set(announced["devices"]["ocs1"]) == {"kind", "tcp", "visa", "serial", "interfaces"}
        assert announced["devices"]["ocs1"]["interfaces"] == "scpi"
        assert ask(announced["devices"]["ocs1"]["tcp"], "*IDN?") == [SPEC.devices[0].idn]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == b""  # exactly one line on stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_command_line_rejects_a_bad_spec(tmp_path):
    spec_file = tmp_path / "bad.json"
    spec_file.write_text('{"devices": [{"name": "x", "kind": "toaster"}]}')
    done = subprocess.run(
        [sys.executable, "-m", "emulators", "serve", str(spec_file)], capture_output=True, cwd=ROOT, timeout=30
    )
    assert done.returncode == 2
    assert b"toaster" in done.stderr and done.stdout == b""
