"""`testbed emulate` as a user runs it: a process that prints endpoints, which a plain pyvisa client can use."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import pyvisa
from processes import stop_with_ctrl_c


def test_plain_pyvisa_client_speaks_scpi_to_the_printed_endpoint(repo):
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "emulate"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    try:
        resource = None
        lines = []
        deadline = time.monotonic() + 30
        while resource is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"pyvisa: (TCPIP0::127\.0\.0\.1::\d+::SOCKET)", line)
            resource = m.group(1) if m else None
        assert resource, "".join(lines) + proc.stderr.read() if proc.poll() is not None else "".join(lines)

        rm = pyvisa.ResourceManager("@py")
        inst = rm.open_resource(resource, read_termination="\n", write_termination="\n", timeout=3000)
        try:
            assert inst.query("*IDN?").strip().startswith("Polatis,")
            assert inst.query(":oxc:swit:size?").strip() == "32,32"
            # Compound message with SCPI path memory: STAT? resolves under :OXC:SWIT:CONN:
            inst.write(":oxc:swit:conn:only (@1,2),(@33,34); stat?")
            assert inst.read().strip() == "(@1,2),(@33,34)"
            assert inst.query("*OPC?").strip() == "1"
            inst.write(":OXC:SWITch:CONNect:ADD (@99),(@33)")  # port 99 does not exist on a 32x32 switch
            assert inst.query("SYST:ERR?").strip().startswith("-222")
            assert inst.query("SYST:ERR?").strip().startswith("0,")
        finally:
            inst.close()
            rm.close()
    finally:
        stop(proc)
    assert proc.returncode == 0


def printed_command(repo, inventory: str, role: str) -> tuple[subprocess.Popen, str]:
    """Start `testbed emulate INVENTORY` and return it with the command it prints for ocs1's `role` line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "emulate", inventory],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    lines, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(f"  {role}: "):
            return proc, line.removeprefix(f"  {role}: ").strip()
    stop(proc)
    raise AssertionError("".join(lines))


def stop(proc: subprocess.Popen) -> None:
    stop_with_ctrl_c(proc, timeout=30)


@pytest.mark.parametrize(
    ("inventory", "role", "expect"),
    [
        ("playbooks/inventory/emulated-rack-netconf.yaml", "ncclient", "http://www.polatis.com/yang/optical-switch"),
        ("playbooks/inventory/emulated-rack-tl1.yaml", "tl1", "M  3 COMPLD"),
        ("playbooks/inventory/emulated-rack-calient.yaml", "tl1", "M  3 COMPLD"),
    ],
)
def test_the_printed_line_works_as_it_is(repo, tmp_path, inventory, role, expect):
    """The line `testbed emulate` prints for a NETCONF or TL1 switch, pasted into a shell: ncclient as it is,
    or a plain TCP session.
    """
    proc, command = printed_command(repo, inventory, role)
    try:
        assert command.startswith("python3 -c ")
        # The shell's python3 is this one (where ncclient is installed), as on a user's machine with the venv on.
        out = subprocess.run(
            command.replace("python3", sys.executable, 1),
            shell=True,  # noqa: S602 (the very line a user pastes into a shell)
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert expect in out.stdout
    finally:
        stop(proc)
    assert proc.returncode == 0
