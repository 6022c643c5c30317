"""Two real testbed-train ranks on two emulated hosts, talking only through the twin's data plane.

Each rank gets its own view of TESTBED_PEERS: its own entry is where it listens, the other entry is the
relay for (its host port) -> (the peer's host port), forwarding to where the peer listens.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
A_TO_B = "(@1),(@10)"  # gpu01:p0 -> gpu02:p0
B_TO_A = "(@2),(@9)"  # gpu02:p0 -> gpu01:p0
HOSTS = [("gpu01", "p0"), ("gpu02", "p0")]  # rank r runs on HOSTS[r]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """Rank processes with their output collected by threads; `wait_for(pred)` blocks on new lines."""

    def __init__(self, ctl, timeout: float):
        ports = [free_port() for _ in HOSTS]
        self.procs: list[subprocess.Popen[str]] = []
        self.steps = [0] * len(HOSTS)
        self.stderr = [""] * len(HOSTS)
        self.changed = threading.Condition()
        self.threads: list[threading.Thread] = []
        for rank, (host, port) in enumerate(HOSTS):
            peers = []
            for peer, (peer_host, peer_port) in enumerate(HOSTS):
                if peer == rank:
                    peers.append(f"127.0.0.1:{ports[rank]}")
                else:
                    peers.append(
                        ctl.call(
                            None,
                            "dataplane.link",
                            src_host=host,
                            src_port=port,
                            dst_host=peer_host,
                            dst_port=peer_port,
                            target_port=ports[peer],
                        )
                    )
            cmd = [sys.executable, "-m", "hostside.train", "--rank", str(rank), "--peers", ",".join(peers)]
            cmd += ["--bind", "127.0.0.1", "--steps", "1000000", "--dim", "8", "--step-time", "0.005"]
            cmd += ["--timeout", str(timeout)]
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
            for target in (self._stdout, self._stderr):
                t = threading.Thread(target=target, args=(rank, proc), daemon=True)
                t.start()
                self.threads.append(t)

    def _stdout(self, rank: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.match(r"step (\d+) ", line)
            if m:
                with self.changed:
                    self.steps[rank] = int(m.group(1))
                    self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def _stderr(self, rank: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.stderr[rank] = proc.stderr.read()

    def wait_for(self, predicate, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def wait_exit(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for t in self.threads:
            t.join(1)
        return [p.returncode for p in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_training_progresses_over_circuits_and_stops_when_one_is_removed(ctl, scpi):
    assert scpi("ocs1", f":OXC:SWIT:CONN:ADD {A_TO_B};:OXC:SWIT:CONN:ADD {B_TO_A};*OPC?") == ["1"]
    job = Job(ctl, timeout=10)
    try:
        assert job.wait_for(lambda: min(job.steps) >= 20, 60), f"no progress: steps {job.steps}, {job.stderr}"
        scpi("ocs1", ":OXC:SWIT:CONN:SUB (@2)")  # break the return direction of the ring
        at_cut = max(job.steps)
        codes = job.wait_exit(5)  # the cut resets the connections at once, well before --timeout
        assert codes == [3, 3], (codes, job.stderr)
        assert max(job.steps) <= at_cut + 1  # no progress after the circuit went away
        # The cut resets both ends of its connection; the first rank to notice names the reset, and the other
        # names either the reset or the first one's exit, whichever reaches it first (a busy machine decides).
        assert all("error:" in err and "the peer died" in err for err in job.stderr), job.stderr
        assert any("reset" in err for err in job.stderr), job.stderr
    finally:
        job.stop()
    state = ctl.call(None, "dataplane.state")
    assert state["totals"]["cut"] >= 1 and state["totals"]["bytes"] > 0
    assert {r["src"]["host"] for r in state["relays"]} == {"gpu01", "gpu02"}


def test_a_wrong_circuit_means_the_job_never_starts(ctl, scpi):
    # gpu01 is wired to gpu03 instead of gpu02: rank 0's ring neighbour is unreachable.
    assert scpi("ocs1", ":OXC:SWIT:CONN:ADD (@1,3,2),(@11,9,10);*OPC?") == ["1"]
    job = Job(ctl, timeout=2)
    try:
        codes = job.wait_exit(15)
        assert codes == [3, 3], (codes, job.stderr)
        assert job.steps == [0, 0]
    finally:
        job.stop()
    assert ctl.call(None, "dataplane.state")["totals"]["refused"] >= 1
