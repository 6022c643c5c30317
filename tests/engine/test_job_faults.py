"""A fault on a rank as its events describe it (what `testbed heal` reads back) and as its kind receives it, and
which rank a failover replaces when several watchers saw a failure.
"""

from __future__ import annotations

from testbed.engine.job.detection import failed_rank
from testbed.engine.job.injection import fault_data, rank_target
from testbed.engine.job.ranks import Rank
from testbed.faults import RankTarget
from testbed.steps.fault_detect import FaultDetectStep


def test_a_faults_description_names_the_rank_its_host_gpu_and_pid():
    rank = Rank(2, "gpu03", 1)
    assert fault_data("gpu.fail", rank, {2: {"pid": 4242, "log": "x.log"}}) == {
        "fault": "gpu.fail@rank2",
        "kind": "gpu.fail",
        "rank": 2,
        "host": "gpu03",
        "gpu": 1,
        "pid": 4242,
    }
    assert fault_data("gpu.fail", rank, {})["pid"] is None  # not running: nothing for heal to end


def test_the_fault_kind_gets_the_rank_as_launched_and_the_steps_xid():
    step = FaultDetectStep("detect", "gpu.fail", 0, 79, 0.05, 5.0, 30.0, None)
    handle = {"pid": 7, "log": "testbed-jobs/rank0/rank0.1.log"}
    assert rank_target(step, Rank(0, "gpu01", 0), handle) == RankTarget(0, "gpu01", 0, handle, {"xid": 79})


def test_an_xid_seen_later_names_the_failed_rank_over_an_earlier_exit():
    detections = [(0, 10, {"detected": "process_exit"}), (3, 30, {"detected": "xid"}), (1, 20, {"detected": "xid"})]
    assert failed_rank(detections)[0] == 1
