"""testbed-train's phased mode (hostside/phased.py) on two emulated hosts, through the twin's data plane:
a phase whose circuit is not up stalls (its connections are refused) and goes on the moment the circuit is set;
a wrongly wired switch breaks the job after --timeout, with an error naming the phase; every byte the ranks say
they had delivered is a byte the data plane carried.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from test_train_over_dataplane import A_TO_B, B_TO_A, HOSTS, free_port

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = 65536


def start(ctl, timeout: float, iterations: int = 2) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Two ranks in static mode (no fabric service): one phase, each sending PAYLOAD bytes to the other."""
    ports = [free_port() for _ in HOSTS]
    procs, relays = [], []
    for rank, (host, port) in enumerate(HOSTS):
        peer = 1 - rank
        relay = ctl.call(
            None,
            "dataplane.link",
            src_host=host,
            src_port=port,
            dst_host=HOSTS[peer][0],
            dst_port=HOSTS[peer][1],
            target_port=ports[peer],
        )
        relays.append(relay)
        phase = {"name": "tp", "config": "tp", "compute_ms": 5, "bytes": PAYLOAD, "to": [[peer, relay]], "from": [peer]}
        spec = {"mode": "static", "iterations": iterations, "phases": [phase]}
        cmd = [sys.executable, "-m", "hostside.train", "--rank", str(rank), "--world-size", "2"]
        cmd += ["--peers", f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", "--timeout", str(timeout)]
        env = {"PATH": "/usr/bin:/bin", "TESTBED_RAIL": json.dumps(spec)}
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs, relays


def finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out.append((proc.returncode, stdout, stderr))
    return out


def refused(ctl) -> int:
    return ctl.call(None, "dataplane.state")["totals"]["refused"]


def test_a_phase_stalls_until_its_circuit_is_up_then_its_bytes_cross_the_data_plane(ctl, scpi):
    procs, relays = start(ctl, timeout=30)
    try:
        deadline = time.monotonic() + 20
        while refused(ctl) < 4:  # both ranks tried and were reset: their phase is stalled
            assert time.monotonic() < deadline, "the ranks never tried the dark path"
            assert all(p.poll() is None for p in procs), finish(procs, 5)
            time.sleep(0.01)  # polling the twin's counter, with a deadline
        assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
        results = finish(procs, 30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [code for code, _, _ in results] == [0, 0], results
    for _, stdout, _ in results:
        first = re.search(r"^step 1 ms ([0-9.]+) stall_ms", stdout, re.M)
        assert first is not None, stdout
        assert "done rank" in stdout
    state = ctl.call(None, "dataplane.state")
    carried = {r["address"]: r["bytes_forward"] for r in state["relays"]}
    for rank, (_, stdout, _) in enumerate(results):
        m = re.search(rf"^sent tp {1 - rank} (\d+) written (\d+)$", stdout, re.M)
        sent, written = int(m.group(1)), int(m.group(2))
        assert sent == 2 * (PAYLOAD + 20)  # two iterations' messages (a 20-byte header each), delivered once
        assert carried[relays[rank]] == sent  # what the partner acknowledged is what crossed the circuit
        # Resends count in what was written, never in what was delivered. Whether any byte went into a connection
        # before its reset depends on when the relay reset it (at connect, or after a first write): not asserted.
        assert written >= sent


def test_a_wrongly_wired_switch_breaks_the_job_naming_the_phase(ctl, scpi):
    # gpu01 is wired to gpu03 instead of gpu02: the ranks' partner is unreachable.
    assert scpi("ocs1", ":OXC:SWIT:CONN:ADD (@1,3,2),(@11,9,10);*OPC?") == ["1"]
    procs, _ = start(ctl, timeout=2)
    results = finish(procs, 30)
    assert [code for code, _, _ in results] == [3, 3], results
    for _, stdout, stderr in results:
        assert "step 1" not in stdout
        assert "phase tp (configuration tp) of iteration 1 did not complete within 2 s" in stderr, stderr
        assert "circuits are not up" in stderr
    assert refused(ctl) >= 2
