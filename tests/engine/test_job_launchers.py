"""The two launchers' programs, as the hosts' actors receive them: the environment each rank (direct) or each
host's torchrun gets, the names and folders of their jobs, the watched rank's wait, what a launch's results
leave running, and what stopping it sends.
"""

from __future__ import annotations

import pytest

from testbed.config.sections import Job
from testbed.contracts.errors import StepFailed
from testbed.engine.device_actor import OpResult
from testbed.engine.job.direct_launcher import DirectLauncher, rank_environment
from testbed.engine.job.launcher import READY, Launch
from testbed.engine.job.layout import Layout
from testbed.engine.job.ports import lab_ports
from testbed.engine.job.ranks import ranks_of
from testbed.engine.job.torchrun_launcher import TorchrunLauncher, host_environment, rendezvous_id, torchrun_command
from testbed.events import Op


def service(host: str) -> dict[str, str]:
    """The fabric service's address as `host` reaches it (a lab's hosts may each see a different one)."""
    return {"TESTBED_FABRIC_SERVICE": f"ctl-for-{host}:7000", "TESTBED_FABRIC_TOKEN": "t0ken"}


def launch(hosts: list[str], launcher: str = "direct", **kwargs) -> Launch:
    job = Job(command=["testbed-train", "--steps", "9"], ranks=hosts, env={"RANK": "99", "NCCL_DEBUG": "INFO"})
    job = job.model_copy(update={"launcher": launcher})
    ranks = ranks_of(hosts)
    layout = Layout.of(ranks, lab_ports(29500, len(ranks)), lambda host: f"{host}.lab")
    return Launch(label="start", number=3, job=job, layout=layout, run_id="run 7/a", **kwargs)


def result(host: str, status: str = "ok", value: object = None) -> OpResult:
    return OpResult(host, "gpu.start_job", "node", status, (0, 0.0), (1, 0.0), value=value)


# --- launcher: direct ------------------------------------------------------------------------------


def test_a_rank_gets_pytorchs_rendezvous_and_testbeds_variables_over_the_playbooks():
    run = launch(["gpu01", "gpu01", "gpu02", "gpu02"], service_env=service, rank_env=lambda r: {"ROUTE": str(r.index)})
    env = rank_environment(run, run.ranks[3])
    assert env == {
        "RANK": "3",  # testbed's, not the playbook's
        "NCCL_DEBUG": "INFO",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "gpu01.lab",
        "MASTER_PORT": "29504",
        "TESTBED_MASTER_HOST": "gpu01",
        "TESTBED_PEERS": "gpu01.lab:29500,gpu01.lab:29501,gpu02.lab:29502,gpu02.lab:29503",
        "TESTBED_CHECKPOINT_DIR": "checkpoints",
        "TESTBED_FABRIC_SERVICE": "ctl-for-gpu02:7000",  # as rank 3's host reaches it
        "TESTBED_FABRIC_TOKEN": "t0ken",
        "ROUTE": "3",
    }


def test_each_rank_is_started_on_its_host_and_the_watched_rank_followed_after_the_starts():
    run = launch(["gpu01", "gpu01", "gpu02"], watch=1, timeout_s=30.0)
    programs = DirectLauncher().programs(run)
    assert list(programs) == ["gpu01", "gpu02"]
    starts = [
        (label, procedure, args["name"], args["gpus"], args["workdir"])
        for label, procedure, args in programs["gpu01"][:2]
    ]
    assert starts == [
        ("start", "gpu.start_job", "rank0.3", [0], "testbed-jobs/run-7-a/start1/rank0"),
        ("start", "gpu.start_job", "rank1.3", [1], "testbed-jobs/run-7-a/start1/rank1"),
    ]
    assert programs["gpu01"][0][2]["command"] == ["testbed-train", "--steps", "9"]
    wait = {"job": "rank1.3", "progress": run.job.progress, "ready": READY, "min_step": 0, "max_s": 30.0}
    assert programs["gpu01"][2] == ("start", "gpu.wait_step", {**wait, "mark": Op.FIRST_STEP})
    assert [p for _, p, _ in programs["gpu02"]] == ["gpu.start_job"]


def test_a_rank_that_failed_to_start_has_no_handle_and_its_failure_is_raised():
    run = launch(["gpu01", "gpu02"], watch=0)
    handle = {"pid": 41, "name": "rank0.3"}
    watched = result("gpu01", value={"step": 1})
    failed = result("gpu02", "fail")
    started = DirectLauncher().started(run, {"gpu01": [result("gpu01", value=handle), watched], "gpu02": [failed]})
    assert started.handles == {0: handle}
    assert started.results[1] is failed and started.watched is watched
    assert failed in started.failures and watched not in started.failures  # the watch is the caller's to raise


def test_stopping_stops_each_running_rank_on_its_host():
    run = launch(["gpu01", "gpu01", "gpu02"])
    handles = {0: {"pid": 1}, 2: {"pid": 3}}
    assert DirectLauncher().stop_programs("stop", run.ranks, handles, {}) == {
        "gpu01": [("stop", "gpu.stop_job", {"job": {"pid": 1}})],
        "gpu02": [("stop", "gpu.stop_job", {"job": {"pid": 3}})],
    }


# --- launcher: torchrun ----------------------------------------------------------------------------


def test_each_node_runs_torchrun_at_rank_0s_rendezvous_with_this_launchs_id():
    run = launch(["gpu02", "gpu02", "gpu01", "gpu01"], "torchrun")
    assert rendezvous_id(run) == "run-7-a-3"
    assert torchrun_command(run, 1) == [
        "torchrun",
        *("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2"),
        *("--rdzv-backend", "static", "--rdzv-endpoint", "gpu02.lab:29504", "--rdzv-id", "run-7-a-3"),
        *("--max-restarts", "0", "--no-python", "testbed-train", "--steps", "9"),
    ]
    programs = TorchrunLauncher().programs(run)
    assert list(programs) == ["gpu02", "gpu01"]  # node 0 is rank 0's host
    (label, procedure, args) = programs["gpu01"][0]
    assert (args["name"], args["gpus"], args["workdir"]) == ("node1.3", [0, 1], "testbed-jobs/run-7-a/start1/node1")


def test_a_slots_directory_is_kept_across_relaunches_of_one_start_and_new_for_each_start_and_run():
    """A rank resumes from the newest checkpoint in its directory: a failover's relaunch must find the start's,
    a new job.start (another trial, another run on the same host) none.
    """
    first = launch(["gpu01", "gpu02"])
    relaunch = first.__class__(**{**first.__dict__, "number": 4})  # same start: a failover's relaunch
    second = first.__class__(**{**first.__dict__, "number": 5, "generation": 2})
    other_run = first.__class__(**{**first.__dict__, "run_id": "run 8"})

    def workdirs(run: Launch) -> list[str]:
        return [args["workdir"] for calls in DirectLauncher().programs(run).values() for _, _, args in calls]

    assert workdirs(first) == workdirs(relaunch)
    assert not set(workdirs(first)) & set(workdirs(second))
    assert not set(workdirs(first)) & set(workdirs(other_run))


def test_a_hosts_torchrun_passes_testbeds_variables_and_each_ranks_own_log():
    run = launch(["gpu01", "gpu01", "gpu02", "gpu02"], "torchrun", service_env=service)
    env = host_environment(run, "gpu02")
    assert env["TESTBED_MASTER_HOST"] == "gpu01" and env["TESTBED_RANK_LOG"] == "rank{rank}.3.log"
    assert env["TESTBED_FABRIC_SERVICE"] == "ctl-for-gpu02:7000" and env["TESTBED_FABRIC_TOKEN"] == "t0ken"
    assert "MASTER_ADDR" not in env  # torchrun sets it
    assert "TESTBED_RANK_LOG" not in host_environment(launch(["gpu01", "gpu02"], "torchrun"), "gpu02")


def test_watching_a_relaunch_under_torchrun_needs_one_rank_per_host():
    with pytest.raises(StepFailed, match="needs one rank per host"):
        TorchrunLauncher().programs(launch(["gpu01", "gpu01", "gpu02", "gpu02"], "torchrun", watch=0))
    programs = TorchrunLauncher().programs(launch(["gpu01", "gpu02"], "torchrun", watch=1))
    assert programs["gpu02"][1][2]["job"] == "node1.3"  # followed through its host's torchrun


def test_a_hosts_ranks_are_watched_through_its_torchrun_and_a_failed_torchrun_raised_once():
    run = launch(["gpu01", "gpu01", "gpu02", "gpu02"], "torchrun")
    launcher = {"pid": 50, "name": "node0.3", "workdir": "testbed-jobs/node0", "log": "testbed-jobs/node0/out.log"}
    failed = result("gpu02", "fail")
    started = TorchrunLauncher().started(run, {"gpu01": [result("gpu01", value=launcher)], "gpu02": [failed]})
    assert started.launchers == {"gpu01": launcher}
    assert started.handles == {
        0: {**launcher, "name": "rank0.3", "log": "testbed-jobs/node0/rank0.3.log"},
        1: {**launcher, "name": "rank1.3", "log": "testbed-jobs/node0/rank1.3.log"},
    }
    assert started.results[2] is started.results[3] is failed
    assert started.failures.count(failed) == 1
    assert TorchrunLauncher().stop_programs("stop", run.ranks, started.handles, started.launchers) == {
        "gpu01": [("stop", "gpu.stop_job", {"job": launcher})]
    }


def test_one_rank_per_host_is_watched_through_its_torchruns_own_log():
    run = launch(["gpu01", "gpu02"], "torchrun")
    launcher = {"pid": 50, "name": "node0.3", "log": "testbed-jobs/node0/out.log"}
    started = TorchrunLauncher().started(run, {"gpu01": [result("gpu01", value=launcher)]})
    assert started.handles == {0: launcher}
