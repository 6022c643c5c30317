"""Driver x fault matrix, host.power_off row on a lab: the fault kind powers a host off and on through its BMC
(the inventory's `bmc:`, Redfish), in the runner's own DeviceActor (the gpu_host family's gpu.power_off /
gpu.power_on, next to the host's SSH driver), against the twin's emulated host and BMC as a lab's would be.

What a lab relies on:
- inject: the host really goes down (its rank's processes die, its SSH refuses), at a moment the host's actor
  marks (the midpoint of the reset request); heal: it comes back (SSH answers);
- `testbed heal` of a run that died with the host off powers it on through the BMC, from the run's own
  record (run.json's inventory names the password's variable; the password itself is in no file of the run);
- a lab run that may power off a host without `bmc:` (or without its password variable set) is refused before
  anything starts, naming the hosts and what to add.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml
from bmc_twin import endpoints, ssh_settings
from rich.console import Console

from emulators.frontends import TWIN_PASSWORD
from testbed.cli.main import main
from testbed.documents.inventory import Inventory
from testbed.engine.device_actor import DeviceActor
from testbed.events import Op, read_jsonl
from testbed.families.drivers import make_driver
from testbed.faults import FAULT_KINDS, FaultEnv, FaultFailed, RankTarget
from testbed.ops.heal import HealDevices, heal_run
from testbed.ops.remains import find
from testbed.results.folder import run_info, write_json
from testbed.results.recorder import Recorder
from testbed.twin.bridge import TwinHandle

KIND = FAULT_KINDS.get("host.power_off")
PASSWORD_ENV = "LAB_BMC_PASSWORD"


@pytest.fixture
def bmc_password(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, TWIN_PASSWORD)  # as a lab's operator exports it before a run


def lab_inventory(twin, with_bmc: bool = True) -> Inventory:
    """A lab's inventory whose addresses happen to be the twin's: gpu01's SSH and BMC."""
    ep = endpoints(twin)
    host, _, port = ep["ssh"].rpartition(":")
    gpu01 = {
        "kind": "gpu_host",
        "driver": "ssh",
        "transport": {
            "type": "ssh",
            "host": host,
            "port": int(port),
            "user": ep["user"],
            "key_file": ep["key_file"],
            "known_hosts": ep["known_hosts"],
        },
        "gpus": 2,
    }
    if with_bmc:
        gpu01["bmc"] = {
            "address": ep["redfish"],
            "user": ep["redfish_user"],
            "password_env": PASSWORD_ENV,
            "ca_file": ep["redfish_ca"],
            "power_wait_ms": 10000,
        }
    return Inventory.model_validate({"name": "lab", "devices": {"gpu01": gpu01}})


def actor(inv: Inventory) -> DeviceActor:
    """The runner's DeviceActor for gpu01, used in-process (no Ray)."""
    interval = sys.getswitchinterval()
    try:
        return DeviceActor("gpu01", "ssh", inv.devices["gpu01"].transport.settings(), None, "gpu_host")
    finally:
        sys.setswitchinterval(interval)  # the actor tunes the interpreter for a Ray worker, not for pytest


def lab_env(act: DeviceActor, inv: Inventory, results: list) -> FaultEnv:
    """What the engine gives a fault kind on a lab (testbed.faults.recording.fault_env): no twin, the device
    procedures (each returning its OpResult, raising when it did not succeed), the run's inventory.
    """

    def call(device: str, procedure: str, kwargs: dict):
        result = act.run(procedure, kwargs)
        results.append(result)
        if result.status != "ok":
            raise FaultFailed(f"{procedure}: {result.status}: {result.error}")
        return result

    return FaultEnv(None, call, inv)


def ssh_refuses(ep: dict) -> bool:
    address, _, port = ep["ssh"].rpartition(":")
    try:
        socket.create_connection((address, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def start_rank(twin):
    ssh = make_driver("ssh", "gpu01", ssh_settings(endpoints(twin)))
    try:
        return ssh.run_job(["sleep", "60"], name="rank0.0", gpus=[0])
    finally:
        ssh.close()


def test_host_power_off_on_a_lab_goes_through_the_bmc_and_heals(twin, ctl, bmc_password):
    inv = lab_inventory(twin)
    rank = start_rank(twin)
    act, results = actor(inv), []
    try:
        env = lab_env(act, inv, results)
        target = RankTarget(0, "gpu01", 0, dataclasses.asdict(rank), {})
        assert act.run("gpu.health", {}).status == "ok"  # the host's SSH connection is up before the fault

        before = time.monotonic_ns()
        injected = KIND.inject(env, target)
        assert injected.marked_by_device and before < injected.at_ns < time.monotonic_ns()
        off = results[-1]
        assert off.procedure == "gpu.power_off" and off.value["power_state"] == "Off"
        reset = [r for r in off.audit if r.data.startswith("POST") and "ComputerSystem.Reset" in r.data]
        assert reset[0].mono_ns <= injected.at_ns <= off.audit[off.audit.index(reset[0]) + 1].mono_ns
        assert not os.path.exists(f"/proc/{rank.pid}")  # the rank died with the host's power
        assert ssh_refuses(endpoints(twin)) and ctl.call("gpu01", "state")["powered"] is False
        assert act.run("gpu.health", {}).status in ("fail", "info")  # the host is unreachable, as it is dark

        KIND.heal(env, target)
        on = results[-1]
        assert on.procedure == "gpu.power_on" and on.value["power_state"] == "On" and "fault_healed" in on.marks
        assert act.run("gpu.health", {}).status == "ok"  # its SSH is back: the actor reconnects
        # The BMC's traffic is in the host's audit, under the BMC's address, without the password.
        bmc = [r for r in off.audit + on.audit if r.address == endpoints(twin)["redfish"]]
        assert any('"ResetType": "ForceOff"' in r.data for r in bmc) and any('"ResetType": "On"' in r.data for r in bmc)
        assert not any(f'"{TWIN_PASSWORD}"' in r.data or f"'{TWIN_PASSWORD}'" in r.data for r in bmc)
    finally:
        act.close()


def test_in_the_twin_the_kind_keeps_its_timed_trigger(twin, ctl):
    """With the twin's control (an emulated run), power_off is the twin's timed op, not the BMC."""

    def no_procedures(device, procedure, kwargs):
        raise AssertionError(f"{procedure} called in the twin")

    env = FaultEnv(TwinHandle(twin), no_procedures, None)
    target = RankTarget(0, "gpu01", 0, {}, {})
    injected = KIND.inject(env, target)
    assert not injected.marked_by_device and ctl.call("gpu01", "state")["powered"] is False
    KIND.heal(env, target)
    assert ctl.call("gpu01", "state")["powered"] is True


# --- testbed heal of a run that died with the host off ------------------------------------------------------


def dead_run(tmp_path, twin, inv: Inventory) -> int:
    """What a runner that died during host.power_off on a lab leaves: run.json (as a run writes it, redacted)
    and its events: the rank started, the fault injected through the BMC (the host is left off), no heal.
    """
    # The user's inventory file, as the run recorded it (heal drives the lab from it, never from run.json).
    inventory_file = tmp_path / "lab.yaml"
    inventory_file.write_text(json.dumps(inv.model_dump(mode="json", exclude_defaults=True)))
    snapshot = inv.model_dump(mode="json")
    info = run_info("dead", "p.yaml", {"name": "power"}, str(inventory_file), snapshot, 0, 1, False, None)
    exited = subprocess.Popen(["true"])
    exited.wait()
    info["runner"] = {"pid": exited.pid, "hostname": socket.gethostname()}  # a runner that is gone
    write_json(tmp_path / "run.json", info)
    recorder = Recorder(tmp_path, "dead")
    lab = HealDevices(inv, recorder)
    rank = start_rank(twin)
    recorder.emit("ok", "gpu.start_job", device="gpu01", step="job.start", data={"value": dataclasses.asdict(rank)})
    step = "host.power_off on rank 0"
    data = {"fault": "host.power_off@rank0", "kind": "host.power_off", "rank": 0, "host": "gpu01", "gpu": 0}
    recorder.emit("invoke", Op.FAULT_INJECT, device="gpu01", step=step, data=data)
    lab.call("gpu01", "gpu.power_off", {"bmc": inv.devices["gpu01"].bmc.call_args("gpu01")}, step)
    recorder.emit("ok", Op.FAULT_INJECT, device="gpu01", step=step, data=data)
    lab.close()
    recorder.close()
    return rank.pid


@pytest.mark.unchecked_history("the dead run's history is written by hand: the fault and the rank, nothing else")
def test_testbed_heal_powers_the_host_on_through_its_bmc(tmp_path, twin, ctl, bmc_password, monkeypatch):
    monkeypatch.setenv("TESTBED_LOCK_DIR", str(tmp_path / "locks"))
    inv = lab_inventory(twin)
    dead_run(tmp_path, twin, inv)
    assert ctl.call("gpu01", "state")["powered"] is False
    (fault,) = find(read_jsonl(tmp_path / "events.jsonl").records).faults
    assert fault.kind == "host.power_off" and fault.certain

    code = heal_run(tmp_path, Console(file=open(os.devnull, "w"), width=200))  # noqa: SIM115
    assert code == 0
    assert ctl.call("gpu01", "state")["powered"] is True and not ssh_refuses(endpoints(twin))
    events = read_jsonl(tmp_path / "events.jsonl").records
    healed = [e for e in events if e["op"] == Op.FAULT_HEAL and e["type"] == "ok"]
    assert healed and "ComputerSystem.Reset On through the BMC of gpu01" in healed[-1]["data"]["how"]
    power_on = [e for e in events if e["op"] == "gpu.power_on" and e["type"] == "invoke"]
    assert power_on[-1]["data"]["bmc"]["password"] == "***"
    assert power_on[-1]["data"]["bmc"]["password_env"] == PASSWORD_ENV  # a variable's name is no secret
    # The password is in no file of the run: not in run.json, the events or the audit log.
    for name in ("run.json", "events.jsonl", "audit.jsonl"):
        text = (tmp_path / name).read_text()
        assert f'"password": "{TWIN_PASSWORD}"' not in text and f"'{TWIN_PASSWORD}'" not in text
    assert json.loads((tmp_path / "run.json").read_text())["inventory"]["devices"]["gpu01"]["bmc"]["password_env"] == (
        PASSWORD_ENV
    )


def test_heal_after_crash_without_a_bmc_says_to_add_one(twin, ctl):
    lab = HealDevices(lab_inventory(twin, with_bmc=False), None)  # a lab: no twin control
    from testbed.ops.remains import ActiveFault

    fault = ActiveFault("host.power_off@rank0", "host.power_off", "gpu01", {"host": "gpu01"}, None, True)
    with pytest.raises(FaultFailed, match=r"the inventory gives gpu01 none; add bmc: \{address: https://HOST"):
        KIND.heal_after_crash(lab, fault)


# --- refused up front ---------------------------------------------------------------------------------------

PLAYBOOK = """\
name: power
job: {command: [sleep, "60"], ranks: [gpu01, gpu02]}
steps:
  - {action: job.start, wait_steps: 0}
  - {action: fault.inject, fault: {kind: host.power_off, target: "rank:1"}, duration_ms: 100}
  - {action: job.stop}
"""


def lab_files(repo, tmp_path, bmc: dict | None) -> list[str]:
    lab = yaml.safe_load((repo / "playbooks/inventory/emulated-rack.yaml").read_text())
    lab["emulated_only"] = False  # as a real lab's inventory would be
    if bmc is not None:
        for host in ("gpu01", "gpu02"):
            lab["devices"][host]["bmc"] = {**bmc, "address": f"https://{host}-bmc.lab.example"}
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab))
    (tmp_path / "power.yaml").write_text(PLAYBOOK)
    return [str(tmp_path / "power.yaml"), "--inventory", str(tmp_path / "lab.yaml")]


def test_a_lab_run_powering_off_a_host_without_a_bmc_is_refused_naming_it(repo, tmp_path, capsys):
    code = main(["run", *lab_files(repo, tmp_path, None), "--results", str(tmp_path / "results"), "--yes"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "host.power_off: a lab powers a host off and on through its BMC, and the inventory gives gpu02 none" in err
    assert "add bmc: {address: https://HOST, user: USER, password_env: VARIABLE} to gpu02" in err
    assert not (tmp_path / "results").exists()  # refused before a run folder exists


def test_a_lab_run_whose_bmc_password_is_not_set_is_refused_naming_the_variable(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    files = lab_files(repo, tmp_path, {"user": "admin", "password_env": PASSWORD_ENV})
    code = main(["run", *files, "--results", str(tmp_path / "results"), "--yes"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "gpu02: the password of its BMC (admin@https://gpu02-bmc.lab.example) is read from the environment " in err
    assert f"variable {PASSWORD_ENV}, which is not set; export {PASSWORD_ENV}=..." in err
    assert "gpu01" not in err  # rank 1 is on gpu02: only the host the plan may power off is checked
    assert not (tmp_path / "results").exists()


# --- a whole run on a lab -----------------------------------------------------------------------------------


def test_a_lab_run_powers_a_rank_host_off_and_on_through_its_bmc(twin, ctl, tmp_path, monkeypatch, testbed_run):
    """`testbed run` on a lab (no --emulate; the twin only stands in for the lab's machines): the fault goes
    from the runner through the host's hub actor to its BMC, and back on when the fault's hold ends.
    """
    monkeypatch.setenv(PASSWORD_ENV, TWIN_PASSWORD)  # the run's process inherits it, as from a lab's shell
    monkeypatch.setenv("TESTBED_LOCK_DIR", str(tmp_path / "locks"))
    devices = {}
    for host in ("gpu01", "gpu02"):
        ep = endpoints(twin, host)
        address, _, port = ep["ssh"].rpartition(":")
        devices[host] = {
            "kind": "gpu_host",
            "driver": "ssh",
            "gpus": 2,
            "transport": {"type": "ssh", "host": address, "port": int(port), "user": ep["user"]}
            | {"key_file": ep["key_file"], "known_hosts": ep["known_hosts"]},
            "bmc": {"address": ep["redfish"], "user": "admin", "password_env": PASSWORD_ENV}
            | {"ca_file": ep["redfish_ca"], "power_wait_ms": 10000},
        }
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump({"name": "lab", "devices": devices}))
    (tmp_path / "power.yaml").write_text(PLAYBOOK)
    run = testbed_run(
        str(tmp_path / "power.yaml"), "--inventory", str(tmp_path / "lab.yaml"), "--yes", "--results", str(tmp_path)
    )
    events = read_jsonl(run / "events.jsonl").records
    off = next(e for e in events if e["op"] == "gpu.power_off" and e["type"] == "ok")
    assert off["device"] == "gpu02" and off["data"]["value"]["power_state"] == "Off"
    mark = next(e for e in events if e["op"] == Op.FAULT_INJECTED)
    assert mark["device"] == "gpu02" and mark["node"]  # taken by the host's actor, at the reset's midpoint
    assert mark["mono_ns"] == off["data"]["value"]["reset_ns"]
    assert any(e["op"] == "gpu.power_on" and e["type"] == "ok" for e in events)
    assert any(e["op"] == Op.FAULT_HEAL and e["type"] == "ok" for e in events)
    rank = next(j for j in ctl.call("gpu02", "state")["jobs"] if j["job"])
    assert rank["returncode"] == -9  # the rank died with its host's power
    assert ctl.call("gpu02", "state")["powered"] is True
    assert json.loads((run / "run.json").read_text())["status"] == "ok"
    for name in ("run.json", "events.jsonl", "audit.jsonl"):
        text = (run / name).read_text()
        assert f'"password": "{TWIN_PASSWORD}"' not in text and f"'{TWIN_PASSWORD}'" not in text
