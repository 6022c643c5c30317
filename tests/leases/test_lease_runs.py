"""A lab shared by a group: runs on a real (non-emulated) switch contend through the lab's leases.

The switch is `testbed emulate`'s, reached at the address it prints, with an inventory written for it as for a
lab: the runs below are real runs (no --emulate). Two control processes on two Ray nodes of one cluster (the
multi-node test's way of starting nodes on this machine) contend for it through the cluster's lease keeper;
without a cluster, runs on this machine contend through its lease folder, another account's reservation among them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accounts import BOB, as_account, needs_root, shared_folder
from processes import stop_with_ctrl_c

from testbed.config.transports import VisaTransport
from testbed.leases import Holder, lease_store
from testbed.leases.file_store import FileLeaseStore
from testbed.leases.identity import device_identity

INVENTORY = """\
name: shared-lab
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "{resource}"}}
    size: 8
    node: {node}
    emulation: {{switching_time_ms: 20, jitter_ms: 0}}
  gpu01: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: gpu01.lab.example, user: lab}}, ports: [p0]}}
  gpu02: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: gpu02.lab.example, user: lab}}, ports: [p0]}}
fibres:
  - {{host: gpu01, port: p0, switch: ocs1, ingress: 1, egress: 9}}
  - {{host: gpu02, port: p0, switch: ocs1, ingress: 2, egress: 10}}
"""

PLAYBOOK = """\
name: pair-cycle
trials: {trials}
configurations:
  pair: {{links: ["gpu01:p0 <-> gpu02:p0"]}}
steps:
  - {{action: fabric.apply, configuration: pair, measure: reconfig}}
  - {{action: fabric.clear}}
"""

DEADLINE_S = 180


@pytest.fixture(scope="module")
def switch(tmp_path_factory, repo):
    """`testbed emulate` of the lab's switch; yields the VISA resource it prints."""
    folder = tmp_path_factory.mktemp("emulated-switch")
    (folder / "inventory.yaml").write_text(INVENTORY.format(resource="TCPIP0::192.0.2.10::5025::SOCKET", node="x"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "emulate", str(folder / "inventory.yaml")],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    resource, lines, deadline = None, [], time.monotonic() + 60
    while resource is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"pyvisa: (TCPIP0::127\.0\.0\.1::\d+::SOCKET)", line)
        resource = m.group(1) if m else None
    assert resource, "".join(lines)
    yield resource
    stop_with_ctrl_c(proc, timeout=30)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {name: cluster.add_node(num_cpus=1, labels={"testbed-node": name}) for name in ("ctrl-a", "ctrl-b")}
    yield cluster, {name: node.node_id for name, node in nodes.items()}
    cluster.shutdown()


class Runs:
    """`testbed run` processes on the lab, each from its control node's copy of the inventory."""

    def __init__(self, repo: Path, folder: Path, resource: str, ray_address: str | None) -> None:
        self.repo, self.folder, self.ray_address = repo, folder, ray_address
        for node in ("ctrl-a", "ctrl-b"):
            text = INVENTORY.format(resource=resource, node=node)
            if ray_address is None:
                text = text.replace(f"    node: {node}\n", "")
            (folder / f"lab-{node}.yaml").write_text(text)
        for trials in (2, 60):
            (folder / f"playbook-{trials}.yaml").write_text(PLAYBOOK.format(trials=trials))

    def command(self, node: str, *extra: str, trials: int = 2) -> list[str]:
        cmd = [sys.executable, "-m", "testbed", "run", str(self.folder / f"playbook-{trials}.yaml")]
        cmd += ["--inventory", str(self.folder / f"lab-{node}.yaml"), "--yes", "--results", str(self.folder / "r")]
        return cmd + (["--ray-address", self.ray_address] if self.ray_address else []) + list(extra)

    def start(self, node: str, *extra: str, trials: int = 2, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(node, *extra, trials=trials),
            cwd=self.repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})},
        )

    def run(self, node: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(node, *extra),
            cwd=self.repo,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env={**os.environ, "COLUMNS": "200"},
        )

    def lease(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "testbed", "lease", *args]
        cmd += ["--ray-address", self.ray_address] if self.ray_address else []
        return subprocess.run(
            cmd, cwd=self.repo, capture_output=True, text=True, timeout=DEADLINE_S, env={**os.environ, "COLUMNS": "250"}
        )


def wait_for_run_lease(proc: subprocess.Popen, leases) -> dict:
    """The run lease `proc` took, once the store shows it (the run then drives the switch for seconds more)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() + proc.stderr.read()
        for lease in leases():
            if lease["holder"]["pid"] == proc.pid:
                return lease
        time.sleep(0.05)  # polling the store for a condition, with a deadline
    raise AssertionError("the run never took its lease")


def wait_for_line(proc: subprocess.Popen, text: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError("".join(lines) + proc.stderr.read())


def finished(proc: subprocess.Popen) -> tuple[int, str]:
    out, err = proc.communicate(timeout=DEADLINE_S)
    return proc.returncode, out + err


def run_folder(output: str) -> Path:
    return Path(re.findall(r"results: (\S+)", output)[-1])


def test_two_control_hosts_contend_for_one_switch_through_the_clusters_lease_keeper(cluster, switch, repo, tmp_path):
    cluster, node_ids = cluster
    keeper_file = Path(os.environ["TESTBED_LEASE_DIR"]) / "testbed-cluster-leases.json"
    identity = device_identity(VisaTransport(type="visa", resource=switch))

    def leases():
        try:
            return [entry["lease"] for entry in json.loads(keeper_file.read_text())["leases"]]
        except (FileNotFoundError, ValueError):
            return []

    runs = Runs(repo, tmp_path, switch, cluster.address)
    first = runs.start("ctrl-a", trials=60)
    held = wait_for_run_lease(first, leases)
    os.kill(first.pid, signal.SIGSTOP)  # the first run holds the switch for as long as the test needs
    try:
        refused = runs.run("ctrl-b")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"ocs1 ({identity}) is in use by run {held['holder']['run']}" in refused.stderr
        assert f"@{held['holder']['host']} (pid {first.pid}) until" in refused.stderr
        assert "--wait" in refused.stderr and "Traceback" not in refused.stderr

        listed = runs.lease("list")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert "ocs1" in listed.stdout and held["holder"]["run"] in listed.stdout and str(first.pid) in listed.stdout

        waiting = runs.start("ctrl-b", "--wait")
        wait_for_line(waiting, "waiting for the lab's leases")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    code, out = finished(first)
    assert code == 0, out
    code, later = finished(waiting)
    assert code == 0, later  # ran once the first released the switch
    for output, node in ((out, "ctrl-a"), (later, "ctrl-b")):
        info = json.loads((run_folder(output) / "run.json").read_text())
        assert info["placement"]["ocs1"]["node_id"] == node_ids[node], info["placement"]
    assert leases() == []  # both released at their end

    # A holder killed outright never releases: its lease ends by itself (a 3 s lease here), and a run waiting
    # for the switch goes ahead then.
    doomed = runs.start("ctrl-a", trials=60, env={"TESTBED_LEASE_TTL_S": "3"})
    lost = wait_for_run_lease(doomed, leases)
    os.kill(doomed.pid, signal.SIGSTOP)  # holds the switch until the waiting run below is waiting
    after = runs.start("ctrl-b", "--wait")
    wait_for_line(after, "waiting for the lab's leases")
    doomed.kill()
    doomed.wait()
    code, output = finished(after)
    assert code == 0, output
    assert lost["id"] not in [lease["id"] for lease in leases()]


@needs_root
def test_without_a_cluster_runs_on_this_machine_contend_through_its_lease_folder(switch, repo, tmp_path, monkeypatch):
    folder = shared_folder()  # as /var/tmp: every account of the machine adds its leases there
    monkeypatch.setenv("TESTBED_LEASE_DIR", str(folder))
    runs = Runs(repo, tmp_path, switch, None)
    identity = device_identity(VisaTransport(type="visa", resource=switch))
    store = lease_store()

    def reserve_as_bob():
        holder = Holder(str(BOB), "ctrl-c", 4242)
        return FileLeaseStore(folder).acquire({"ocs1": identity}, holder, "reservation", 3600, "bob's sweep")

    # Another user of this machine reserved the switch for the evening.
    (bob,) = as_account(BOB, reserve_as_bob)

    refused = runs.run("ctrl-a")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"ocs1 ({identity}) is reserved by {BOB}@ctrl-c (pid 4242) until" in refused.stderr
    assert '("bob\'s sweep")' in refused.stderr

    listed = runs.lease("list")
    assert f"{BOB}@ctrl-c" in listed.stdout and "bob's sweep" in listed.stdout and bob.id in listed.stdout
    not_mine = runs.lease("release", "--id", bob.id, "--inventory", str(tmp_path / "lab-ctrl-a.yaml"))
    assert not_mine.returncode == 2 and "no lease of yours" in not_mine.stderr

    as_account(BOB, lambda: FileLeaseStore(folder).release(ids=[bob.id]))
    mine = runs.lease(
        "acquire", "ocs1", "--for", "1h", "--note", "my sweep", "--inventory", str(tmp_path / "lab-ctrl-a.yaml")
    )
    assert mine.returncode == 0, mine.stdout + mine.stderr
    ran = runs.run("ctrl-a")  # one's own reservation lets one's own runs through
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert [lease.note for lease in store.list()] == ["my sweep"]  # the run's own lease was released
    released = runs.lease("release", "--inventory", str(tmp_path / "lab-ctrl-a.yaml"))
    assert released.returncode == 0 and "ocs1" in released.stdout
    assert store.list() == []


def test_a_run_paused_past_its_lease_stops_before_its_next_command(switch, repo, tmp_path, monkeypatch):
    """A run stopped longer than its lease lives (a suspend, a paused VM, SIGSTOP) comes back to a device that may
    be another's by now: it sends nothing more, records why, and fails with a clear error.
    """
    folder = tmp_path / "leases"
    monkeypatch.setenv("TESTBED_LEASE_DIR", str(folder))
    runs = Runs(repo, tmp_path, switch, None)
    store = FileLeaseStore(folder)
    paused = runs.start("ctrl-a", trials=60, env={"TESTBED_LEASE_TTL_S": "2"})
    wait_for_run_lease(paused, lambda: [lease.to_json() for lease in store.list()])
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while store.list() and time.monotonic() < deadline:  # until the lease has lapsed in the store
            time.sleep(0.1)  # polling the store for a condition, with a deadline
        assert store.list() == []
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    code, output = finished(paused)
    assert code == 1, output
    assert "lapsed" in output and "another user may hold these devices now" in output and "Traceback" not in output
    events = [json.loads(line) for line in (run_folder(output) / "events.jsonl").read_text().splitlines()]
    lapsed = next(i for i, e in enumerate(events) if e["op"] == "lease.lapsed")
    assert not [e for e in events[lapsed:] if e["type"] == "invoke"]  # no command after it


def test_one_device_named_twice_in_an_inventory_is_refused_before_anything_is_opened(repo, tmp_path):
    inventory = INVENTORY.format(resource="TCPIP0::localhost.::9::SOCKET", node="x").replace("    node: x\n", "")
    inventory = inventory.replace(
        "  gpu01:",
        "  ocs2: {kind: ocs, driver: polatis-scpi, transport: {type: serial, port: 'socket://127.0.0.1:9'}, size: 8}\n"
        "  gpu01:",
    )
    (tmp_path / "lab.yaml").write_text(inventory)
    (tmp_path / "pb.yaml").write_text(
        "name: both\ntrials: 1\nconfigurations:\n  both: {circuits: {ocs1: [[1, 9]], ocs2: [[2, 10]]}}\n"
        "steps:\n  - {action: fabric.apply, configuration: both}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "testbed", "run", str(tmp_path / "pb.yaml"), "--inventory", str(tmp_path / "lab.yaml")]
        + ["--yes", "--results", str(tmp_path / "r")],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ocs1 and ocs2 are one device (tcp://127.0.0.1:9)" in done.stderr and "Traceback" not in done.stderr
