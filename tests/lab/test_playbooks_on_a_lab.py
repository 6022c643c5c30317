"""Every shipped playbook on a lab, as a group first tries testbed on its own devices: `testbed emulate
--fault-proxy` serves the rack (with a Toxiproxy-compatible proxy and its HTTP API in front of every TCP
endpoint, as a lab with network chaos wires it), and the lab's inventory is written by hand from the lines it
prints: the OCS at the proxy's listen address with the `fault_proxy:` line pasted under it, the chip's serial
port, each host's SSH port, key and known_hosts. The runs are real runs (no --emulate, no twin control): faults
take their lab paths (signals over SSH, the straggler agent, the Toxiproxy API), and `testbed check` passes on
each; `testbed heal` after a kill -9 removes the dead run's toxic through the API.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from failover_every_kind import assert_each_failover_replaced_the_host_its_fault_hit, playbook
from injob_every_kind import assert_each_failover_recovered_in_job
from injob_every_kind import playbook as in_job_playbook
from peers import require_peer
from processes import stop_with_ctrl_c

from testbed.faults.transport import ToxiproxyApi

pytestmark = pytest.mark.timeout(900)

HAND_WRITTEN = """\
name: our-lab
description: the rack, its OCS behind our Toxiproxy

devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "{ocs1_visa}", timeout_ms: 5000}}
    size: 32
    reserved_ports: [31, 32, 63, 64]
    {ocs1_fault_proxy}
  chip1:
    kind: photonic_mesh
    driver: qontrol-mesh
    transport: {{type: serial, port: "{chip1_serial}", baudrate: 115200}}
    size: 8
{hosts}
fibres:
{fibres}
spares: [gpu09, gpu10]
"""

HOST = """\
  {name}:
    kind: gpu_host
    driver: ssh
    transport: {{type: ssh, host: 127.0.0.1, port: {port}, user: lab, key_file: "{key}", known_hosts: "{known}"}}
    gpus: 8
    ports: [{ports}]
    bmc: {{address: "{bmc}", user: {bmc_user}, password_env: OUR_LAB_BMC_PASSWORD, ca_file: "{bmc_ca}"}}
"""

# A transport fault held long enough for the runner to be killed under it.
LONG_LATENCY = """\
name: slow-ocs
trials: 1
steps:
  - action: fault.inject
    fault: {kind: transport.latency, device: ocs1, attributes: {latency: 300}}
    duration_ms: 600000
"""

WAIT_S = 120  # bound on waiting for a run to reach a point (a slow CI machine), not a timing claim


def hand_written_inventory(printed: str) -> str:
    """The inventory a user writes from `testbed emulate --fault-proxy`'s output."""
    device, values, ssh, bmcs = None, {}, {}, {}
    for line in printed.splitlines():
        if m := re.match(r"^(\w+) \(", line):
            device = m.group(1)
        elif device == "ocs1" and (m := re.search(r"pyvisa: (TCPIP0::\S+)", line)):
            values["ocs1_visa"] = m.group(1)
        elif device == "ocs1" and line.strip().startswith("fault_proxy: "):
            values["ocs1_fault_proxy"] = line.strip()  # pasted as printed
        elif device == "chip1" and (m := re.search(r"qontrol: (\S+)", line)):
            values["chip1_serial"] = m.group(1)
        elif m := re.search(r"ssh: ssh .*-p (\d+) -i (\S+) -o UserKnownHostsFile=(\S+)", line):
            ssh[device] = m.groups()
        elif m := re.search(
            r"redfish \(curl\): curl -sS --cacert (\S+) -u (\w+):(\S+) (https://127\.0\.0\.1:\d+)/", line
        ):
            bmcs[device] = {"bmc_ca": m.group(1), "bmc_user": m.group(2), "bmc": m.group(4)}
            # The lab's BMC password, as its users keep it: in the environment of the shell that runs testbed.
            os.environ["OUR_LAB_BMC_PASSWORD"] = m.group(3)
    hosts = "".join(
        HOST.format(
            name=f"gpu{i:02d}", port=port, key=key, known=known, ports="p0, p1, p2" if i <= 8 else "p0, p1",
            **bmcs[f"gpu{i:02d}"],
        )
        for i, (port, key, known) in ((int(name[3:]), ssh[name]) for name in sorted(ssh))
    )  # fmt: skip
    fibres = [
        f"  - {{host: gpu{h:02d}, port: p{p}, switch: ocs1, ingress: {2 * h - 1 + p}, egress: {32 + 2 * h - 1 + p}}}"
        for h in range(1, 11)
        for p in (0, 1)
    ]
    fibres += [f"  - {{host: gpu{h:02d}, port: p2, switch: chip1, ingress: {h}, egress: {8 + h}}}" for h in range(1, 9)]
    return HAND_WRITTEN.format(hosts=hosts, fibres="\n".join(fibres), **values)


@contextlib.contextmanager
def emulated_lab(repo: Path, *args: str):
    """`testbed emulate ARGS` running for the block; yields what it printed up to "running; ..."."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed", "emulate", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    try:
        lines, deadline = [], time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("running;"):
                break
        assert lines and lines[-1].startswith("running;"), "".join(lines) + (proc.stderr.read() if proc.poll() else "")
        yield "".join(lines)
    finally:
        stop_with_ctrl_c(proc)


@pytest.fixture(scope="module")
def lab(repo, tmp_path_factory):
    """`testbed emulate --fault-proxy` of the default rack: what it printed, the hand-written inventory, and
    the OCS's proxy through the Toxiproxy API the inventory names.
    """
    folder = tmp_path_factory.mktemp("our-lab")
    with emulated_lab(repo, "--fault-proxy") as printed:
        inventory = folder / "our-lab.yaml"
        inventory.write_text(hand_written_inventory(printed))
        from testbed.documents import load_inventory

        proxy = ToxiproxyApi.of(load_inventory(inventory).model, "ocs1", "test")
        yield printed, inventory, folder, proxy


def cli(repo: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=repo, capture_output=True, text=True, timeout=timeout
    )


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_emulate_prints_each_devices_proxy_and_its_fault_proxy_line(lab):
    printed, _, _, proxy = lab
    blocks = dict(re.findall(r"^(\w+) \(\w+\)\n((?:  .*\n)+)", printed, re.MULTILINE))
    listens = {}
    for device in ("ocs1", "chip1", "gpu01", "gpu10"):
        listen = re.search(r"fault proxy: listens on (127\.0\.0\.1:\d+) \(the device's address", blocks[device])
        line = re.search(r'fault_proxy: \{api: "(http://127\.0\.0\.1:\d+)", proxy: (\w+)\}', blocks[device])
        assert listen and line, blocks[device]
        assert line.group(1) == proxy.api and line.group(2) == device
        # The proxy of that name on that API listens where the line above says.
        assert ToxiproxyApi(device, proxy.api, device).state()["listen"] == listen.group(1)
        listens[device] = listen.group(1).rsplit(":", 1)[1]
    # ... which is the address the device's own lines give: what a lab's inventory uses.
    assert f"pyvisa: TCPIP0::127.0.0.1::{listens['ocs1']}::SOCKET" in blocks["ocs1"]
    assert f"ssh -F /dev/null -p {listens['gpu01']} " in blocks["gpu01"]


def test_chaos_failover_runs_on_the_lab_through_its_toxiproxy_and_checks(lab, repo):
    _, inventory, folder, proxy = lab
    # With seed 7 these draw timeout, latency, slicer and down. The OCS's timeout_ms (5000, as labs set it) is
    # longer than the rewiring's retry window: a stalled attempt must still leave time to try again.
    trials = 4
    proc = cli(
        repo, "run", "playbooks/chaos-failover.yaml", "--inventory", str(inventory), "--trials", str(trials),
        "--yes", "--results", str(folder / "results"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    checked = cli(repo, "check", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    info = json.loads((run_dir / "run.json").read_text())
    assert info["emulate"] is False and info["inventory"]["devices"]["ocs1"]["fault_proxy"]["api"] == proxy.api
    events = events_of(run_dir)
    injected = [e for e in events if e["op"] == "fault.inject" and e["type"] == "ok" and e.get("device") == "ocs1"]
    healed = [e for e in events if e["op"] == "fault.heal" and e["type"] == "ok" and e.get("device") == "ocs1"]
    assert len(injected) == len(healed) == trials
    assert {e["data"]["kind"] for e in injected} == {
        "transport.timeout",
        "transport.latency",
        "transport.slicer",
        "transport.down",
    }
    state = proxy.state()  # every toxic the run added is gone, the proxy up again
    assert state["toxics"] == [] and state["enabled"] is True
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == trials  # every failover rewired again once the connection was back


def test_a_failover_on_every_fault_kind_runs_on_the_lab_and_leaves_no_host_off(lab, repo):
    """On the lab every kind takes its lab path: gpu.fail and process.kill by signals over SSH, process.hang by
    SIGSTOP and SIGCONT, host.power_off by the host's BMC (Redfish), healed by powering it on again.
    """
    _, inventory, folder, _ = lab
    (folder / "every-kind.yaml").write_text(playbook())
    proc = cli(
        repo, "run", str(folder / "every-kind.yaml"), "--inventory", str(inventory), "--yes",
        "--results", str(folder / "results"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert_each_failover_replaced_the_host_its_fault_hit(run_dir)
    checked = cli(repo, "check", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    from drivers.redfish import RedfishBmc, RedfishSettings
    from testbed.documents import load_inventory

    hosts = load_inventory(inventory).model.hosts()
    states = {}
    for name, host in hosts.items():
        with RedfishBmc(RedfishSettings.from_dict(host.bmc.call_args(name)), name) as bmc:
            states[name] = bmc.power_state()
    assert {name: state for name, state in states.items() if state != "On"} == {}  # the one that lost power too
    secret = os.environ["OUR_LAB_BMC_PASSWORD"].encode()  # used by every power-off and power-on of the run
    assert [str(p) for p in run_dir.rglob("*") if p.is_file() and secret in p.read_bytes()] == []


def test_an_in_job_failover_on_every_fault_kind_runs_on_the_lab_and_checks(lab, repo):
    """recovery: in-job on the lab: the job's store on the controller, at the inventory's controller_address, reached
    by every host's ranks and parked spares; each kind on its lab path, each trial recovered by a parked spare.
    """
    require_peer("torch", "its ranks train with PyTorch, and the controller holds PyTorch's store")
    _, inventory, folder, _ = lab
    trials = 2
    (folder / "in-job-every-kind.yaml").write_text(in_job_playbook(trials))
    proc = cli(
        repo, "run", str(folder / "in-job-every-kind.yaml"), "--inventory", str(inventory), "--yes",
        "--results", str(folder / "results"), timeout=800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert_each_failover_recovered_in_job(run_dir, trials, None)
    checked = cli(repo, "check", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_heal_after_a_kill9_removes_the_dead_runs_toxic_through_the_api(lab, repo):
    _, inventory, folder, proxy = lab
    (folder / "slow-ocs.yaml").write_text(LONG_LATENCY)
    results = folder / "killed"
    run = subprocess.Popen(
        [sys.executable, "-m", "testbed", "run", str(folder / "slow-ocs.yaml"), "--inventory", str(inventory)]
        + ["--yes", "--results", str(results)],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # killed with its process group, as a terminal's kill would
    )
    deadline = time.monotonic() + WAIT_S
    while not any(t["name"] == "latency-1" for t in proxy.state()["toxics"]):
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline, "the run never added its toxic"
        time.sleep(0.05)  # polling the Toxiproxy for the toxic, with a deadline
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    assert [t["name"] for t in proxy.state()["toxics"]] == ["latency-1"]  # the dead run left it behind

    run_dir = next(results.iterdir())
    healed = cli(repo, "heal", str(run_dir), timeout=300)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert (
        f"fault transport.latency@ocs1: toxic latency-1 removed from proxy ocs1 through the Toxiproxy API at "
        f"{proxy.api}" in healed.stdout
    )
    assert proxy.state()["toxics"] == []
    checked = cli(repo, "check", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# Every other shipped playbook on the same hand-written lab (chaos-failover is the test above).
# opus-failover.yaml is for the 2048-GPU lab: its own test is at the end.
PLAYBOOKS = [
    "ocs-reconfig",
    "gpu-health",
    "detect-failure",
    "gpu-failover",
    "mesh-all-to-all",
    "mesh-failover",
    "rail-reconfig",
    "collective-reconfig",
    "straggler",
    "torch-failover",
    "torch-failover-restart",
    "torchft-failover",
]


def test_every_shipped_playbook_has_its_run_on_the_hand_written_lab(repo):
    shipped = {p.stem for p in (repo / "playbooks").glob("*.yaml")}
    assert shipped == {*PLAYBOOKS, "chaos-failover", "opus-failover"}


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_a_shipped_playbook_runs_on_the_hand_written_lab_and_checks(lab, repo, playbook):
    if playbook.startswith("torch-failover"):
        require_peer("torch", "its ranks train with PyTorch (pip install 'testbed[torch]')")
    if playbook == "torchft-failover":
        require_peer("torchft", "its replica groups train in TorchFT's loop (pip install -e '.[torchft]')")
    _, inventory, folder, _ = lab
    proc = cli(
        repo, "run", f"playbooks/{playbook}.yaml", "--inventory", str(inventory), "--trials", "1", "--yes",
        "--results", str(folder / "results"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    checked = cli(repo, "check", str(run_dir), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert info["emulate"] is False and info["inventory"]["name"] == "our-lab"
    # indexed as it ended, as a lab's run, in the catalog of its results folder (docs/catalog.md)
    listed = cli(repo, "runs", "--results", str(folder / "results"), "--lab", "--playbook", playbook, "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    runs = {r["folder"]: r for r in json.loads(listed.stdout)}
    assert runs[run_dir.name]["target"] == "lab" and runs[run_dir.name]["inventory"] == "our-lab"


# opus-failover.yaml on the 2048-GPU lab: `testbed emulate playbooks/inventory/opus-2048.yaml` serves all 256
# hosts and 8 rails; the group's inventory, written by hand, describes the part of the lab it uses (its 8 job
# hosts, the 8 spares, rails 0 and 1), cabled as the lab is.
OPUS_BY_HAND = """\
name: our-part-of-opus
groups:
  hosts: {{kind: gpu_host, driver: ssh, gpus: 8, ports: [r0, r1]}}
devices:
  rail0: {{kind: ocs, driver: polatis-scpi, transport: {{type: visa, resource: "{rail0}"}}, size: 256}}
  rail1: {{kind: ocs, driver: polatis-scpi, transport: {{type: visa, resource: "{rail1}"}}, size: 256}}
{hosts}
fibres:
  - for: {{n: 1..8, k: 0..1}}
    host: "h{{n:03d}}"
    port: "r{{k}}"
    switch: "rail{{k}}"
    ingress: "{{n}}"
    egress: "{{256 + n}}"
  - for: {{n: 249..256, k: 0..1}}
    host: "h{{n:03d}}"
    port: "r{{k}}"
    switch: "rail{{k}}"
    ingress: "{{n}}"
    egress: "{{256 + n}}"
spares: ["h[249:256]"]
"""
OPUS_HOST = """\
  {name}:
    group: hosts
    transport: {{type: ssh, host: 127.0.0.1, port: {port}, user: lab, key_file: "{key}", known_hosts: "{known}"}}
"""


def test_opus_failover_runs_on_its_part_of_the_2048_gpu_lab_and_checks(repo, tmp_path):
    with emulated_lab(repo, "playbooks/inventory/opus-2048.yaml") as printed:
        device, visa, ssh = None, {}, {}
        for line in printed.splitlines():
            if m := re.match(r"^(\w+) \(", line):
                device = m.group(1)
            elif m := re.search(r"pyvisa: (TCPIP0::\S+)", line):
                visa[device] = m.group(1)
            elif m := re.search(r"ssh: ssh .*-p (\d+) -i (\S+) -o UserKnownHostsFile=(\S+)", line):
                ssh[device] = m.groups()
        names = [f"h{n:03d}" for n in [*range(1, 9), *range(249, 257)]]
        assert set(names) <= set(ssh) and {"rail0", "rail1"} <= set(visa), printed[-2000:]
        hosts = "".join(
            OPUS_HOST.format(name=name, port=ssh[name][0], key=ssh[name][1], known=ssh[name][2]) for name in names
        )
        inventory = tmp_path / "our-part-of-opus.yaml"
        inventory.write_text(OPUS_BY_HAND.format(rail0=visa["rail0"], rail1=visa["rail1"], hosts=hosts))
        proc = cli(
            repo, "run", "playbooks/opus-failover.yaml", "--inventory", str(inventory), "--trials", "1", "--yes",
            "--results", str(tmp_path / "results"),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
        checked = cli(repo, "check", str(run_dir), timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["spans"]["failover.total"]["n"] == 1
