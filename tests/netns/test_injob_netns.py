"""In-job recovery (`job.recovery: in-job`) with `--emulate --netns`, where the job's gloo traffic crosses the
kernel's circuits (docs/netns.md): its ranks reach each other only over the data addresses routed on the job's
ports, so a link that goes dark cuts them off, as on a lab (on loopback, without --netns, the ranks' gloo traffic
crosses no emulated link, and link.down cannot reach it).

- playbooks/torch-failover.yaml as a user runs it: every trial resumes at the step it failed in, `testbed check`
  passes, nothing of the run is left;
- a link that goes dark while the failover forms the next generation (the spare's fibre disabled through the
  switch's own procedure, between the spare's choice and the rewiring, with no light check to stop the failover)
  ends the failover within its bound, naming the rank, the spare and the slot, and why: the members gave up forming
  the generation's group within the job's --timeout (gloo alone retries a connection whose SYNs are dropped for
  minutes). This one runs the engine in-process
  (a LocalDispatcher of DeviceActors, the real drivers against the twin's real endpoints) to act at that moment.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from injob_harness import failed_failover, steps_failed_in, survivors
from peers import require_peer

from testbed.events import Op
from testbed.faults.link import link_ports
from testbed.twin import netns

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from runner_process import cli  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"),
    # each job.start imports PyTorch in six processes on a 2-core machine; the margin is for a loaded one
    pytest.mark.timeout(1200),
]


@pytest.fixture(autouse=True)
def _peers():
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")
    require_peer("torch", "the in-job failover runs the real PyTorch job, and the controller's store is PyTorch's")


def test_torch_failover_in_job_resumes_every_trial_at_the_step_it_failed_in_over_the_kernel_circuits(repo, tmp_path):
    proc = cli("run", "playbooks/torch-failover.yaml", "--emulate", "--netns", "--results", str(tmp_path), cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    info = json.loads((run_dir / "run.json").read_text())
    assert info["twin_dataplane"]["relays"] == 0 and info["twin_dataplane"]["kernel_bytes"] > 0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    truth = [json.loads(line) for line in (run_dir / "twin_truth.jsonl").read_text().splitlines()]
    trials = json.loads((run_dir / "summary.json").read_text())["trials"]
    assert trials["ok"] == 3
    for trial in range(3):
        mine = [e for e in events if e.get("trial") == trial]
        starts = [e for e in mine if e["op"] == "gpu.start_job" and e["type"] == "invoke"]
        assert {s["step"] for s in starts} == {"start job"}  # the failover started no process
        (resumed,) = [e for e in mine if e["op"] == Op.FAILOVER_RESUMED]
        (published,) = [e["data"] for e in mine if e["op"] == Op.GENERATION_PUBLISHED]
        assert published["spare"] == resumed["device"] and published["rank"] == resumed["data"]["rank"]
        failed_in = steps_failed_in(truth, survivors(starts, published["slot"]))
        # none lost: the spare's first step is the newest step a survivor failed in
        assert failed_in and resumed["data"]["step"] == max(failed_in), (trial, failed_in, resumed)
    checked = cli("check", str(run_dir), cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert netns.leftovers(info["twin"]["netns"]["tag"]) == {"namespaces": [], "links": [], "processes": []}


STALL = """\
name: in-job-link-down
job:
  command: [testbed-torch-train, --steps, "1000000", --dim, "16", --hidden, "32", --step-time, "0.02",
            --checkpoint-every, "10", --timeout, "5", --start-timeout, "120"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  recovery: in-job
  fabric: {topology: ring, port: p0, reverse_port: p1, verify_light: false}
steps:
  - {action: job.start, wait_steps: 4, timeout_ms: 240000}
  - {action: failover, fault: {kind: process.kill, target: "rank:1"}, heartbeat_ms: 50, timeout_ms: 20000}
  - {action: job.stop}
"""


class _DisableAt:
    """Disables the chosen spare's p0 fibre (its two switch ports, through the switch family's procedure, as
    link.down does) the moment the failover records spare_selected: the recorder calls its observers in the thread
    that emits, so the rewiring starts only once the link is dark.
    """

    def __init__(self, coordinator, inventory) -> None:
        self.c, self.inventory = coordinator, inventory
        self.disabled: tuple[str, list[int]] | None = None

    def on_event(self, event) -> None:
        if event.op != Op.SPARE_SELECTED or self.disabled is not None:
            return
        switch, ports = link_ports(self.inventory, f"{event.data['spare']}:p0")
        self.disabled = (switch, list(ports))
        self.c.call({switch: ("ocs.disable_ports", {"ports": list(ports)})}, "link.down at spare_selected")

    def heal(self) -> None:
        if self.disabled is not None:
            switch, ports = self.disabled
            self.c.call({switch: ("ocs.enable_ports", {"ports": ports})}, "heal link.down")


def test_a_link_that_goes_dark_while_the_generation_forms_ends_the_failover_naming_the_rank_and_slot(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seen: dict = {}

    def dark_at_spare_selected(jobs) -> None:
        seen["tag"] = jobs.c.twin.netns["tag"]
        seen["dark"] = _DisableAt(jobs.c, jobs.inventory)
        jobs.c.recorder.add_observer(seen["dark"])

    def heal(jobs) -> None:
        seen["dark"].heal()
        seen["plane"] = jobs.c.twin.call(None, "dataplane.state")["totals"]
        seen["failovers"] = jobs.failovers

    truth = run_dir / "twin_truth.jsonl"  # the twin's namespaces are tagged from the run's folder
    error = failed_failover(STALL, run_dir, dark_at_spare_selected, heal, truth=truth, netns=True)
    tag, dark, plane = seen["tag"], seen["dark"], seen["plane"]
    assert netns.leftovers(tag) == {"namespaces": [], "links": [], "processes": []}
    assert plane["relays"] == 0 and plane["kernel_bytes"] > 0  # the job's traffic was the kernel's to cut
    assert dark.disabled is not None and seen["failovers"] == 1
    assert re.search(
        r"generation 1 did not form: rank 1 on the spare gpu(09|10) \(in slot gpu02\) did not reach its first step "
        r"\(bound 20 s\): .*process group of generation 1 not formed",
        error,
    ), error
