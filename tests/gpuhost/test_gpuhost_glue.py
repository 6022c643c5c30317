"""Inventory -> twin for GPU hosts: the spec, the rewritten SSH transport, and the loopback guard."""

from __future__ import annotations

import pytest

import testbed.twin.bridge as twin
from emulators.gpuhost.spec import GpuHostSpec
from testbed.documents.inventory import Inventory
from testbed.families import PROCEDURES
from testbed.families.context import ProcedureContext
from testbed.families.drivers import make_driver

INV = {
    "name": "lab",
    "devices": {
        "gpu01": {
            "kind": "gpu_host",
            "driver": "ssh",
            "transport": {"type": "ssh", "host": "gpu01.lab.example", "user": "lab"},
            "gpus": 2,
        }
    },
}


def test_point_at_twin_rewrites_ssh_to_loopback_with_the_twins_keys(monkeypatch):
    inv = Inventory.model_validate(INV)
    spec = twin.twin_spec(inv, seed=3)
    assert spec.devices == [GpuHostSpec("gpu01", gpus=2, user="lab", seed=3000)]
    with pytest.raises(Exception, match="non-loopback"):
        twin.assert_loopback(inv, ["gpu01"])
    ep = {
        "devices": {
            "gpu01": {
                "kind": "gpu_host",
                "ssh": "127.0.0.1:2222",
                "user": "lab",
                "known_hosts": "/tmp/kh",
                "key_file": "/tmp/id",
            }
        }
    }
    pointed = twin.point_at_twin(inv, ep)
    t = pointed.devices["gpu01"].transport
    assert (t.host, t.port, t.known_hosts, t.key_file, t.user) == ("127.0.0.1", 2222, "/tmp/kh", "/tmp/id", "lab")
    twin.assert_loopback(pointed, ["gpu01"])


def test_gpu_procedures_drive_a_job_through_the_runner_interface(settings, gpu_host):
    drv = make_driver("ssh", "gpu01", settings)
    ctx = ProcedureContext("gpu01", settings.address)
    info = PROCEDURES["gpu.identify"](drv, ctx)
    assert info["serial"] == "gpu01" and [g["index"] for g in info["gpus"]] == [0, 1, 2, 3]
    job = PROCEDURES["gpu.start_job"](drv, ctx, command=["sleep", "60"], name="p", gpus=[0])
    assert "job_started" in ctx.marks and job["pid"] > 0
    assert PROCEDURES["gpu.job_status"](drv, ctx, job=job)["state"] == "running"
    assert PROCEDURES["gpu.stop_job"](drv, ctx, job=job)["result"] == "terminated"
    drv.close()
