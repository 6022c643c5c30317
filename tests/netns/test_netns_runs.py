"""Runs with `--emulate --netns` (docs/netns.md): the shipped playbooks pass and `testbed check` passes on them,
every address a host was given is on the management network, and nothing of the run is left after it, nor after
a kill -9 of the runner and its twin followed by `testbed heal`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from accounts import BOB, as_account
from peers import require_peer
from straggler_evidence import assert_the_stops_slowed_the_job, straggled_intervals

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from runner_process import cli, start_run, wait_for_event  # noqa: E402

from testbed.twin import netns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")


@pytest.fixture(autouse=True)
def _pyroute2():
    require_peer("pyroute2", "the twin makes its namespaces and links with pyroute2")


def run_netns(repo: Path, results: Path, playbook: str, *extra: str) -> Path:
    proc = cli("run", playbook, "--emulate", "--netns", "--results", str(results), *extra, cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))


def network_of(run_dir: Path) -> dict:
    info = json.loads((run_dir / "run.json").read_text())
    network = info["twin"]["netns"]
    assert network["tag"] == netns.tag_of(info["run"])  # heal finds it from the run's id alone
    return network


def assert_nothing_left(tag: str) -> None:
    assert netns.leftovers(tag) == {"namespaces": [], "links": [], "processes": []}


def _audit(run_dir: Path) -> str:
    return (run_dir / "audit.jsonl").read_text()


def check(repo: Path, run_dir: Path) -> None:
    proc = cli("check", str(run_dir), cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gpu_health_on_hosts_in_namespaces(repo, tmp_path):
    run_dir = run_netns(repo, tmp_path, "playbooks/gpu-health.yaml")
    network = network_of(run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    subnet = ipaddress.ip_network(network["subnet"])
    for host, where in network["hosts"].items():
        ep = info["twin"]["devices"][host]
        assert ep["ssh"].startswith(f"{where['address']}:") and ep["redfish"].startswith(f"https://{where['address']}:")
        assert ipaddress.ip_address(where["address"]) in subnet
    check(repo, run_dir)
    assert_nothing_left(network["tag"])


def test_gpu_failover_on_hosts_in_namespaces(repo, tmp_path):
    """Each rank listens on its host's data address, which exists only inside the host's namespace: the run's ranks
    could not have started anywhere else. Their ring crossed the kernel data plane, no relay.
    """
    run_dir = run_netns(repo, tmp_path, "playbooks/gpu-failover.yaml", "--trials", "3")
    network = network_of(run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["twin_dataplane"]["kernel_bytes"] > 0 and info["twin_dataplane"]["relays"] == 0
    data = set(network["data"].values())
    peers = {p.rpartition(":")[0] for p in ",".join(re.findall(r"TESTBED_PEERS=(\S+)", _audit(run_dir))).split(",")}
    assert peers and peers <= data
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    check(repo, run_dir)
    assert_nothing_left(network["tag"])


def test_straggler_on_hosts_in_namespaces(repo, tmp_path):
    """The straggle agent, started over SSH in its host's namespace, stops a rank there: the whole ring slows (its
    iterations hold the stops, as in tests/integration/test_straggler.py), and no agent or stopped rank is left.
    """
    playbook = tmp_path / "straggler.yaml"
    playbook.write_text((repo / "playbooks/straggler.yaml").read_text().replace("[0.25, 0.5, 0.75]", "[0.5]"))
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    run_dir = run_netns(repo, tmp_path / "r", str(playbook), "--inventory", inventory)
    spans = json.loads((run_dir / "summary.json").read_text())["spans"]
    assert {"baseline.time", "straggled.time"} <= set(spans)
    assert_the_stops_slowed_the_job(straggled_intervals(run_dir), duty=0.5, period_ms=200)
    check(repo, run_dir)
    assert_nothing_left(network_of(run_dir)["tag"])


CHAOS_TRIALS = 6  # with seed 7 these draw timeout and down (a hidden acknowledgement) among the network faults


@pytest.mark.timeout(300)
def test_chaos_failover_on_hosts_in_namespaces(repo, tmp_path):
    """The OCS's fault proxy stays a box of the control side while the ranks' ring crosses the kernel data plane:
    the network faults hide acknowledgements (info), and every failover still rewires and resumes.
    """
    run_dir = run_netns(repo, tmp_path, "playbooks/chaos-failover.yaml", "--trials", str(CHAOS_TRIALS))
    network = network_of(run_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["op"] == "ocs.reconfigure" and e["type"] == "info" for e in events)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"]["ok"] == CHAOS_TRIALS
    info = json.loads((run_dir / "run.json").read_text())
    assert info["twin_dataplane"]["kernel_bytes"] > 0 and info["twin_dataplane"]["relays"] == 0
    check(repo, run_dir)
    assert_nothing_left(network["tag"])


RAIL = """\
name: rail-netns
description: playbooks/rail-reconfig.yaml cut to four hosts and two sweep points, its real job asking the service
trials: 1
configurations:
  tp: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0"]}
  dp: {links: ["gpu01:p0 <-> gpu03:p0", "gpu02:p0 <-> gpu04:p0"]}
  rails: {links: ["gpu01:p0 <-> gpu02:p0", "gpu03:p0 <-> gpu04:p0", "gpu01:p1 <-> gpu03:p1", "gpu02:p1 <-> gpu04:p1"]}
workloads:
  card:
    phases:
      - {name: tp, configuration: tp, compute_ms: 60, bytes: 65536}
      - {name: dp, configuration: dp, compute_ms: 40, bytes: 65536}
    static: rails
job:
  command: [testbed-train, --timeout, "30"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  fabric_service: {configurations: [tp, dp]}
sweep:
  mode: [on-demand, provisioning]
  delay_ms: [0]
steps:
  - {action: rail.train, workload: card, mode: "${mode}", delay_ms: "${delay_ms}", iterations: 3}
teardown:
  - {action: fabric.clear}
"""


def test_rail_reconfig_fabric_service_on_the_management_network(repo, tmp_path):
    """The job's fabric service listens on the control side's management address and the ranks, in their hosts'
    namespaces, reach it there (testbed/fabric_service/addresses.py picks it from the route to each host): every
    connection it took came from a host's management address.
    """
    playbook = tmp_path / "rail.yaml"
    playbook.write_text(RAIL)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    run_dir = run_netns(repo, tmp_path / "r", str(playbook), "--inventory", inventory)
    network = network_of(run_dir)
    addresses = {w["address"] for w in network["hosts"].values()}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    peers = [e["data"]["peer"] for e in events if e["op"] == "fabric_service.connect"]
    answers = [e for e in events if e["op"] == "fabric_service.answer"]
    assert peers and answers
    assert {p.rpartition(":")[0] for p in peers} <= addresses
    check(repo, run_dir)
    assert_nothing_left(network["tag"])


@pytest.mark.parametrize("playbook", ["playbooks/gpu-failover.yaml", "playbooks/chaos-failover.yaml"])
def test_kill9_of_runner_and_twin_then_heal_leaves_nothing(repo, tmp_path, playbook):
    """chaos-failover's twin also runs the OCS's fault proxy, in the control side's namespace."""
    results = tmp_path / "results"
    proc = start_run(repo, [playbook, "--emulate", "--netns", "--results", str(results)])
    run_dir = wait_for_event(results, proc, "gpu.wait_step", "ok")  # the ranks run
    info = json.loads((run_dir / "run.json").read_text())
    tag, twin_pid = info["twin"]["netns"]["tag"], info["twin_pid"]
    # The twin first (a twin whose runner died stops by itself, taking its network with it), then the runner.
    os.kill(twin_pid, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = netns.leftovers(tag)
    # The network outlived its twin; the ranks too, unless the failover had them stopped at that moment (heal must
    # leave nothing either way).
    assert left["namespaces"] and left["links"]
    healed = cli("heal", str(run_dir), cwd=repo)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert "network namespace" in healed.stdout
    assert_nothing_left(tag)
    again = cli("heal", str(run_dir), cwd=repo)
    assert again.returncode == 0 and "nothing to heal" in again.stdout, again.stdout + again.stderr


@pytest.mark.unchecked_history("a run refused before it starts records nothing")
def test_without_root_a_clear_error_and_no_traceback(repo, capfd):
    from testbed.cli.main import main

    def refused():
        os.chdir(repo)
        return main(["run", "playbooks/gpu-health.yaml", "--emulate", "--netns", "--results", "/tmp"])

    assert as_account(BOB, refused) == 2
    err = capfd.readouterr().err
    assert "--netns" in err and "root" in err and "Traceback" not in err


def test_netns_without_emulate_is_refused(repo):
    proc = cli("run", "playbooks/gpu-health.yaml", "--netns", cwd=repo)
    assert proc.returncode == 2 and "--emulate" in proc.stderr and "Traceback" not in proc.stderr


def test_lab_session_with_netns(repo, tmp_path):
    from rich.console import Console

    import testbed

    with testbed.Lab(
        repo / "playbooks/inventory/emulated-rack.yaml",
        emulate=True,
        netns=True,
        results=tmp_path,
        console=Console(quiet=True),
    ) as lab:
        first = lab.run(repo / "playbooks/gpu-health.yaml")
        second = lab.run(repo / "playbooks/gpu-health.yaml")  # the same devices: the same namespaces
        assert first.status == second.status == "ok"
        tag = network_of(first.folder)["tag"]
        assert json.loads((second.folder / "run.json").read_text())["twin"]["netns"]["tag"] == tag
        assert netns.leftovers(tag)["namespaces"]
    assert_nothing_left(tag)


TORCHRUN = """\
name: torchrun-netns
trials: 1
job:
  command: [testbed-train, --steps, "1000000", --dim, "16", --step-time, "0.02", --checkpoint-every, "10",
            --timeout, "10"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  launcher: torchrun
  fabric: {topology: ring, port: p0, reverse_port: p1}
steps:
  - {action: job.start, wait_steps: 12}
  - {action: failover, fault: {kind: gpu.fail, target: "rank:0"}, heartbeat_ms: 50}
  - {action: job.stop}
"""


def test_torchrun_rendezvous_at_node_0s_own_address(repo, tmp_path):
    """torchrun's rendezvous endpoint (and so MASTER_ADDR) is node 0's host's management address, as a lab's host
    name gives; after rank 0's failover it is the spare's, which took node 0.
    """
    playbook = tmp_path / "torchrun.yaml"
    playbook.write_text(TORCHRUN)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    run_dir = run_netns(repo, tmp_path / "r", str(playbook), "--inventory", inventory)
    hosts = network_of(run_dir)["hosts"]
    audit = (run_dir / "audit.jsonl").read_text()
    endpoints = {e.rpartition(":")[0] for e in re.findall(r"rdzv-endpoint (\S+)", audit)}
    assert hosts["gpu01"]["address"] in endpoints  # the first launch: gpu01 is node 0
    spares = {w["address"] for h, w in hosts.items() if h not in ("gpu01", "gpu02", "gpu03", "gpu04")}
    assert endpoints - {hosts["gpu01"]["address"]} <= spares and endpoints & spares  # the relaunch: the spare's
    check(repo, run_dir)
    assert_nothing_left(network_of(run_dir)["tag"])


@pytest.mark.parametrize("playbook", ["playbooks/torch-failover.yaml", "playbooks/torch-failover-restart.yaml"])
def test_torch_failover_sends_its_gloo_traffic_over_the_circuits(repo, tmp_path, playbook):
    """playbooks/torch-failover.yaml (in-job: the parked spare joins the survivors' next generation) and its restart
    variant (DDP under torchrun, every rank restarted): a real PyTorch job whose gloo traffic crosses the kernel data
    plane (its ranks can reach each other nowhere else: the data addresses are routed over the ports only), rewired
    through the spare by the failover. In-job, the ranks and the spare reach the controller's store on the
    management network.
    """
    require_peer("torch", "torch-failover runs a real PyTorch job: pip install 'testbed[torch]'")
    run_dir = run_netns(repo, tmp_path, playbook, "--trials", "1")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["twin_dataplane"]["relays"] == 0
    assert info["twin_dataplane"]["kernel_bytes"] > 500_000  # the model's gradients, many steps
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    if "restart" not in playbook:
        assert any(e["op"] == "generation_published" for e in events)
        stores = {
            e["data"]["env"]["TESTBED_STORE"].rpartition(":")[0]
            for e in events
            if e["op"] == "gpu.start_job" and e["type"] == "invoke"
        }
        assert stores == {network_of(run_dir)["gateway"]}  # this side of the management network
    check(repo, run_dir)
    assert_nothing_left(network_of(run_dir)["tag"])


TORCH = """\
name: torch-{name}
trials: 1
on_failure: continue
job:
  command: [testbed-torch-train, --steps, "1000000", --dim, "16", --hidden, "32", --step-time, "0.02",
            --checkpoint-every, "10", --timeout, "3", --start-timeout, "8"]
  ranks: [gpu01, gpu02, gpu03, gpu04]
  launcher: torchrun
  env: {{TESTBED_TWIN_TORCHRUN: real}}
  fabric: {{topology: ring, port: p0, reverse_port: p1, verify_light: false}}
steps:
  - {{action: job.start, wait_steps: 12}}
{steps}
  - {{action: job.stop}}
"""


def _torch_fails(repo: Path, tmp_path: Path, name: str, steps: str, inventory: Path) -> tuple[Path, str]:
    require_peer("torch", "a real PyTorch job: pip install 'testbed[torch]'")
    playbook = tmp_path / f"{name}.yaml"
    playbook.write_text(TORCH.format(name=name, steps=steps))
    proc = cli(
        "run",
        str(playbook),
        "--emulate",
        "--netns",
        "--inventory",
        str(inventory),
        "--results",
        str(tmp_path / "r"),
        cwd=repo,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("results: "))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    check(repo, run_dir)
    assert_nothing_left(network_of(run_dir)["tag"])
    return run_dir, proc.stderr


def test_a_link_down_on_a_circuit_the_torch_job_uses_breaks_it(repo, tmp_path):
    """gpu01:p0 carries ranks 0 -> 1 of the ring; no route goes round it, so gloo's collectives stall and the job
    fails with its own timeout, which the run reports.
    """
    steps = """\
  - {action: fault.inject, fault: {kind: link.down, link: "gpu01:p0"}, duration_ms: 6000}
  - {action: job.measure, steps: 20, timeout_ms: 15000}"""
    _, err = _torch_fails(repo, tmp_path, "link-down", steps, repo / "playbooks/inventory/emulated-rack.yaml")
    assert "received: 'error: rank" in err and "did not answer" in err, err  # its own words, in the run's error


def test_a_torch_failover_rewired_to_the_wrong_ports_breaks_the_job(repo, tmp_path):
    """The spares' p0 fibres land on other switch ports than the fibre map says (test_failover_miscabled's lab)
    and no light check stops the failover: the relaunched job's ring has no path to the spare, and it fails with
    its own error.
    """
    from test_failover_miscabled import MISCABLED

    text = (repo / "playbooks/inventory/emulated-rack.yaml").read_text()
    for host, ingress, egress, real_in, real_out in MISCABLED:
        right = f"{{host: {host}, port: p0, switch: ocs1, ingress: {ingress}, egress: {egress}}}"
        text = text.replace(right, right[:-1] + f", emulation: {{ingress: {real_in}, egress: {real_out}}}}}")
    inventory = tmp_path / "miscabled-rack.yaml"
    inventory.write_text(text)
    steps = "  - {action: failover, fault: {kind: gpu.fail}, heartbeat_ms: 50, timeout_ms: 60000}"  # > the start bound
    run_dir, err = _torch_fails(repo, tmp_path, "miscabled", steps, inventory)
    ops = {json.loads(line)["op"] for line in (run_dir / "events.jsonl").read_text().splitlines()}
    assert "job_relaunched" in ops and "failover.total" not in ops
    assert "received: 'error: rank" in err and "gloo" in err.lower(), err  # its own words, in the run's error


PROXIED = """\
name: proxied-host
trials: 1
steps:
  - action: parallel
    steps:
      - {action: fault.inject, fault: {kind: transport.latency, device: gpu01, attributes: {latency: 100}},
         duration_ms: 2000}
      - {action: hosts.health, name: health through the fault}
"""


def test_a_fault_proxy_in_front_of_a_host_reaches_it_in_its_namespace(repo, tmp_path):
    """A transport fault on a host puts Toxiproxy's stand-in in front of its SSH: a box of the control side
    (127.0.0.1), forwarding to the host's management address, which it reaches; the health check goes through it.
    """
    playbook = tmp_path / "proxied.yaml"
    playbook.write_text(PROXIED)
    inventory = str(repo / "playbooks/inventory/emulated-rack.yaml")
    run_dir = run_netns(repo, tmp_path / "r", str(playbook), "--inventory", inventory)
    network = network_of(run_dir)
    gpu01 = json.loads((run_dir / "run.json").read_text())["twin"]["devices"]["gpu01"]
    assert gpu01["ssh"].startswith("127.0.0.1:")
    assert gpu01["ssh_direct"].startswith(f"{network['hosts']['gpu01']['address']}:")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["op"] == "gpu.health" and e["type"] == "ok" and e.get("device") == "gpu01" for e in events)
    check(repo, run_dir)
    assert_nothing_left(network["tag"])
