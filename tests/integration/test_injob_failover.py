"""In-job recovery (`job.recovery: in-job`) on the twin, with the real PyTorch job (testbed-torch-train over gloo):

- a failover on every fault kind a failover takes (gpu.fail, process.kill, process.hang, host.power_off), each on
  its own rank, in each of several trials of one run: the host the fault hit is the one replaced, by a spare parked
  since job.start, no process is started during a failover, the spare's first step is the step the survivors failed
  in, every fault is healed and `testbed check` passes;
- every stall bounded, each ending in an error that names the rank and the slot: a spare that never arrives (its
  process stopped), a survivor that hangs while the next generation forms. These run the engine in-process (a
  LocalDispatcher of DeviceActors, the real drivers against the twin's real endpoints) to reach the processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from injob_every_kind import JOB, assert_each_failover_recovered_in_job, playbook
from injob_harness import failed_failover
from peers import require_peer

from drivers.redfish import RedfishBmc, RedfishSettings
from emulators.frontends import TWIN_PASSWORD_ENV
from testbed.events import Op
from testbed.ops.check import check_run

# Each job.start imports PyTorch in six processes (four ranks, two spares) on a 2-core machine: a trial of four
# failovers takes a minute or two when idle; the margin is for a loaded one.
pytestmark = pytest.mark.timeout(1200)

TRIALS = 3


def test_an_in_job_failover_on_every_fault_kind_resumes_each_trial_at_the_step_it_failed_in(repo, tmp_path):
    require_peer("torch", "the in-job failover runs the real PyTorch job, and the controller's store is PyTorch's")
    (tmp_path / "every-kind.yaml").write_text(playbook(TRIALS))
    done = subprocess.run(
        [sys.executable, "-m", "testbed", "run", str(tmp_path / "every-kind.yaml"), "--emulate"]
        + ["--results", str(tmp_path / "results")],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    lines: dict[str, list[str]] = {}  # job name -> its lines (each job.start names its processes afresh)
    for line in (run_dir / "twin_truth.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "line":
            lines.setdefault(record["job"], []).append(record["line"])
    assert_each_failover_recovered_in_job(run_dir, TRIALS, lines)
    checked = check_run(run_dir)
    assert checked.ok, checked.checks
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == TRIALS


def _bounded_run(tmp_path: Path, stall, heal=None) -> str:
    """One trial of an in-job failover (process.kill on rank 1) run in-process, with `stall(jobs)` done between
    job.start and the failover, and `heal(jobs)` (if given) once it failed, before job.stop; the failover's error.
    """
    require_peer("torch", "the in-job failover runs the real PyTorch job, and the controller's store is PyTorch's")
    text = "name: in-job-stall\n" + JOB.format(timeout=5) + "steps:\n"
    text += "  - {action: job.start, wait_steps: 4, timeout_ms: 240000}\n"
    text += '  - {action: failover, fault: {kind: process.kill, target: "rank:1"}, heartbeat_ms: 50, '
    text += "timeout_ms: 8000}\n"
    text += "  - {action: job.stop}\n"
    return failed_failover(text, tmp_path, stall, heal)


def test_a_spare_that_never_arrives_ends_the_failover_within_its_bound_naming_the_rank_and_slot(tmp_path):
    def stop_the_spares(jobs) -> None:
        for handle in jobs.spares.values():  # parked, then stopped for good: never joins
            os.kill(handle["pid"], signal.SIGSTOP)

    error = _bounded_run(tmp_path, stop_the_spares)
    assert re.search(
        r"generation 1 did not form: rank 1 on the spare gpu(09|10) \(in slot gpu02\) did not reach its first step "
        r"\(bound 8 s\): .*did not reach step 0 within 8 s",
        error,
    ), error


def test_a_survivor_that_hangs_while_the_generation_forms_is_named_by_the_spare(tmp_path):
    def hang_rank_2(jobs) -> None:
        os.kill(jobs.handles[2]["pid"], signal.SIGSTOP)  # a survivor of the fault on rank 1, stopped

    error = _bounded_run(tmp_path, hang_rank_2)
    assert re.search(
        r"generation 1 did not form: rank 1 on the spare gpu(09|10) \(in slot gpu02\) did not reach its first step "
        r".*generation 1: slot gpu03 \(rank 2\) did not join within 5 s",
        error,
    ), error


def _bmc(twin, host: str) -> RedfishBmc:
    """`host`'s emulated BMC through the Redfish driver, as a lab's inventory would give it (the twin's password)."""
    ep = twin.endpoints["devices"][host]
    settings = RedfishSettings(
        address=ep["redfish"],
        user=ep["redfish_user"],
        password=os.environ[TWIN_PASSWORD_ENV],
        ca_file=ep["redfish_ca"],
        timeout_s=10.0,
        power_wait_s=10.0,
    )
    return RedfishBmc(settings, host)


class _PowerOffAt:
    """Powers `host` off through its BMC (Reset ForceOff, PowerState read back Off) the moment the run records
    `op`: the recorder calls its observers in the thread that emits, so the failover goes on only once it is off.
    """

    def __init__(self, bmc: RedfishBmc, op: str) -> None:
        self.bmc, self.op, self.done = bmc, op, False

    def on_event(self, event) -> None:
        if event.op == self.op and not self.done:
            self.done = True
            self.bmc.power_off()


def test_a_survivor_whose_host_powers_off_while_the_generation_forms_is_named_by_the_spare(tmp_path):
    """gpu03 (rank 2, a survivor of the fault on rank 1) loses power through its BMC once the failover has marked
    generation 0 aborted and chosen the spare: the survivors have left their group and wait for generation 1,
    which names gpu03, whose process is gone. The spare and the other survivors wait for it within the job's
    bound, and the failover ends naming it.
    """
    bmcs: dict[str, RedfishBmc] = {}

    def power_off_gpu03_at_spare_selected(jobs) -> None:
        bmcs["gpu03"] = bmc = _bmc(jobs.c.twin, "gpu03")
        jobs.c.recorder.add_observer(_PowerOffAt(bmc, Op.SPARE_SELECTED))

    def power_on(jobs) -> None:
        with bmcs["gpu03"] as bmc:
            assert bmc.power_state() == "Off"  # the failover really ran with gpu03 off
            bmc.power_on()  # so that job.stop reaches every host

    error = _bounded_run(tmp_path, power_off_gpu03_at_spare_selected, power_on)
    assert re.search(
        r"generation 1 did not form: rank 1 on the spare gpu(09|10) \(in slot gpu02\) did not reach its first step "
        r".*generation 1: slot gpu03 \(rank 2\) did not join within 5 s",
        error,
    ), error
