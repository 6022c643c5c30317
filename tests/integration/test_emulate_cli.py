"""`testbed emulate` as a user runs it: a process that prints endpoints, which a plain pyvisa client can use."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pyvisa


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
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0
