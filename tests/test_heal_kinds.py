"""`testbed heal` heals each fault by its kind's own definition, against a live twin: each twin fault a run can
leave behind (a lost GPU, a straggler, a host powered off, a transport toxic) is undone through the twin's
control API."""

from __future__ import annotations

import pytest

from drivers.registry import make_driver
from drivers.ssh import SshSettings
from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import OcsSpec, TwinSpec
from emulators.twin import TwinProcess
from testbed.dead_run import ActiveFault
from testbed.faults import FAULT_KINDS
from testbed.heal import Lab


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
        lab = Lab(inventory=None, recorder=None, control=control)

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

    from testbed.config.fault import FaultKindName

    assert set(get_args(FaultKindName)) == set(FAULT_KINDS.names())
    assert {"process.hang", "process.kill", "gpu.fail", "host.power_off", "host.straggle"} <= set(FAULT_KINDS.names())
    for kind in FAULT_KINDS:
        assert callable(kind.heal_after_crash) and kind.target in ("rank", "connection")


def test_a_fault_a_lab_cannot_heal_without_the_twin_says_so():
    lab = Lab(inventory=None, recorder=None, control=None)
    with pytest.raises(Exception, match="only the twin can heal a host.power_off"):
        healer_for("host.power_off")(lab, fault("host.power_off", "gpu01"))
    assert "nothing to undo" in healer_for("gpu.fail")(lab, fault("gpu.fail", "gpu01"))
