"""`testbed heal` heals each fault by its kind's own definition, against a live twin: each twin fault a run can
leave behind (a lost GPU, a straggler, a host powered off, a transport toxic) is undone through the twin's
control API.
"""

from __future__ import annotations

import pytest

from drivers.transports.ssh import SshSettings
from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess
from testbed.families.drivers import make_driver
from testbed.faults import FAULT_KINDS
from testbed.ops.heal import HealDevices
from testbed.ops.remains import ActiveFault


def healer_for(kind: str):
    return FAULT_KINDS.get(kind).heal_after_crash


def fault(kind: str, device: str, job: dict | None = None, **data) -> ActiveFault:
    return ActiveFault(f"{kind}@rank0", kind, device, {"kind": kind, "host": device, **data}, job, True)


def test_twin_faults_are_healed_through_the_twin_control():
    spec = TwinSpec(devices=[GpuHostSpec("gpu01", gpus=2), OcsSpec("ocs1", size=8)], fault_proxy=True)
    with TwinProcess(spec) as twin:
        ep = twin.endpoints.devices["gpu01"]
        host, _, port = ep["ssh"].rpartition(":")
        settings = SshSettings(
            host=host, port=int(port), user="lab", key_file=ep["key_file"], known_hosts=ep["known_hosts"]
        )
        ssh = make_driver("ssh", "gpu01", settings)
        job = ssh.run_job(["sleep", "60"], name="rank0.1", gpus=[0])
        control = twin.control
        lab = HealDevices(inventory=None, recorder=None, control=control)

        control.call("gpu01", "straggle", pid=job.pid, duty=0.5, period_ms=100)
        control.call("gpu01", "fail_gpu", index=1)
        control.call("ocs1", "proxy.add_toxic", name="slow", type="latency", attributes={"latency": 200})
        healer_for("host.straggle")(lab, fault("host.straggle", "gpu01", job={"pid": job.pid}))
        healer_for("gpu.fail")(lab, fault("gpu.fail", "gpu01", gpu=1))
        healer_for("transport.latency")(lab, fault("transport.latency", "ocs1"))
        state = control.call("gpu01", "state")
        assert not any(j["straggling"] for j in state["jobs"])
        assert not any(g["lost"] for g in state["gpus"])
        assert control.call("ocs1", "proxy.state")["toxics"] == []

        control.call("gpu01", "power_off")
        healer_for("host.power_off")(lab, fault("host.power_off", "gpu01"))
        assert control.call("gpu01", "state")["powered"]
        ssh.close()


def test_every_fault_kind_a_playbook_can_name_heals_after_a_crash():
    from typing import get_args

    from testbed.faults.model import FaultKindName

    assert set(get_args(FaultKindName)) == set(FAULT_KINDS.names())
    assert {"process.hang", "process.kill", "gpu.fail", "host.power_off", "host.straggle"} <= set(FAULT_KINDS.names())
    assert "link.down" in FAULT_KINDS.names()
    for kind in FAULT_KINDS:
        assert callable(kind.heal_after_crash) and kind.target in ("rank", "connection", "ports")


def test_a_fault_a_lab_cannot_heal_without_the_twin_says_so():
    lab = HealDevices(inventory=None, recorder=None, control=None)
    # On a lab a host is powered on through its BMC (tests/redfish/test_power_off_lab.py); without one, heal
    # says what to add.
    with pytest.raises(Exception, match=r"host.power_off on gpu01: a lab powers a host off and on through its BMC"):
        healer_for("host.power_off")(lab, fault("host.power_off", "gpu01"))
    assert "nothing to undo" in healer_for("gpu.fail")(lab, fault("gpu.fail", "gpu01"))


def test_link_down_is_healed_by_enabling_the_ports_the_dead_run_recorded(repo, tmp_path):
    """On a lab as in a live twin: heal's own HealDevices (the run's device actor code, its interlock guard, recorded
    in the run's history) enables the switch ports the dead run's fault.inject names.
    """
    from drivers.transports import TransportSettings
    from testbed.documents import load_inventory
    from testbed.events import read_jsonl
    from testbed.results.recorder import Recorder
    from testbed.twin.bridge import point_at_twin, twin_spec

    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    with TwinProcess(twin_spec(inventory, 0, only={"ocs1"})) as twin:
        lab_inventory = point_at_twin(inventory, twin.endpoints.to_json())
        resource = lab_inventory.devices["ocs1"].transport.resource
        ocs = make_driver("polatis-scpi", "ocs1", TransportSettings("visa", resource, 5.0, read_termination="\n"))
        ocs.set_port_enabled([1, 33], False)  # what the dead run's link.down on gpu01:p0 left
        lab = HealDevices(lab_inventory, Recorder(tmp_path, "dead-run"), control=None)  # no twin control: as on a lab
        try:
            data = {"fault": "link.down@gpu01:p0", "kind": "link.down", "device": "ocs1", "ports": [1, 33]}
            dead = ActiveFault("link.down@gpu01:p0", "link.down", "ocs1", {**data, "link": "gpu01:p0"}, None, True)
            how = healer_for("link.down")(lab, dead)
            assert how == "enabled port(s) [1, 33] of ocs1 (now 1: E, 33: E)"
            assert ocs.port_states([1, 33]) == {1: "E", 33: "E"}

            # A history that does not say which ports is refused, not guessed at.
            with pytest.raises(Exception, match="does not say which ports"):
                healer_for("link.down")(lab, ActiveFault("link.down@x", "link.down", "ocs1", {}, None, False))
        finally:
            lab.close()
            ocs.close()
    events = read_jsonl(tmp_path / "events.jsonl").records
    assert [(e["type"], e["op"]) for e in events] == [
        ("invoke", "ocs.enable_ports"),
        ("mark", "fault_healed"),
        ("ok", "ocs.enable_ports"),
    ]
    sent = [a["data"] for a in read_jsonl(tmp_path / "audit.jsonl").records if a["direction"] == "tx"]
    assert ":OXC:SWIT:PORT:ENAB (@1,33)\n" in sent


def test_a_lab_straggle_is_healed_over_ssh_by_ending_the_agent_the_dead_run_recorded(repo, tmp_path):
    """host.straggle on a lab: the dead run left testbed-straggle running on the host (its pid in the result of
    gpu.straggle_start); heal's own Lab, without twin control, ends it and continues the rank over SSH.
    """
    from testbed.documents import load_inventory
    from testbed.events import read_jsonl
    from testbed.results.recorder import Recorder
    from testbed.twin.bridge import point_at_twin, twin_spec

    inventory = load_inventory(str(repo / "playbooks/inventory/emulated-rack.yaml")).model
    with TwinProcess(twin_spec(inventory, 0, only={"gpu01"})) as twin:
        lab_inventory = point_at_twin(inventory, twin.endpoints.to_json())
        ssh = make_driver("ssh", "gpu01", lab_inventory.devices["gpu01"].transport.settings())
        job = ssh.run_job(["sleep", "60"], name="rank0.1", gpus=[0])
        agent, _, _ = ssh.start_straggle(job, 0.5, 100)  # what the dead run started
        lab = HealDevices(lab_inventory, Recorder(tmp_path, "dead-run"), control=None)  # no twin control: as on a lab
        try:
            handle = {"host": "gpu01", "name": job.name, "pid": job.pid, "log": job.log, "workdir": job.workdir}
            started = {"op": "gpu.straggle_start", "device": "gpu01", "value": {"pid": job.pid, "agent": agent}}
            dead = fault("host.straggle", "gpu01", job=handle, pid=job.pid)
            dead.calls = [started]
            how = healer_for("host.straggle")(lab, dead)
            assert how == (
                f"straggler agents on gpu01: {agent} terminated (the run's agent {agent}: terminated); "
                f"SIGCONT to pid {job.pid}'s process group"
            )
            jobs = {j["pid"]: j for j in twin.control.call("gpu01", "state")["jobs"]}
            assert not jobs[agent]["alive"] and jobs[job.pid]["alive"]
            assert ssh.job_status(job).state == "running"
            # Without the rank's job in the history there is nothing to go on: said, not guessed.
            with pytest.raises(Exception, match="does not say which rank"):
                healer_for("host.straggle")(lab, fault("host.straggle", "gpu01"))
        finally:
            lab.close()
            ssh.close()
    events = read_jsonl(tmp_path / "events.jsonl").records
    assert [(e["type"], e["op"]) for e in events] == [
        ("invoke", "gpu.straggle_stop"),
        ("mark", "fault_healed"),
        ("ok", "gpu.straggle_stop"),
    ]
