"""The emulated host's torchrun, its workers (emulators/gpuhost/torchrun/workers.py), with plain Python processes
for workers: torchrun's environment and command line for each, the host's allowlist, where error files go, the
monitor finding the one that failed, the stop (SIGKILL for a worker that ignores SIGTERM), and the failure report.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from emulators.gpuhost.torchrun.options import parse_args
from emulators.gpuhost.torchrun.rendezvous import Assignment
from emulators.gpuhost.torchrun.workers import (
    ALLOWLIST_ENV,
    Worker,
    failure_summary,
    log_dirs,
    monitor,
    program_refusal,
    start_workers,
    stop_workers,
    worker_argv,
    worker_env,
)

NODE_1_OF_2 = Assignment(group_rank=1, group_world_size=2, base_rank=2, world_size=4, master_addr="h0", master_port=7)


def python_workers(code: str, *args: str, nproc: int = 2):
    """A config whose workers run `python -c code args` (by path, as --no-python runs a program)."""
    return parse_args(
        ["--nproc-per-node", str(nproc), "--rdzv-id", "job", "--no-python", sys.executable, "-c", code, *args]
    )


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    stop_workers(started, signal.SIGKILL, timeout=5)


def test_each_worker_gets_torchruns_variables_for_its_rank():
    cfg = parse_args(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--rdzv-id", "r7", "train.py"])
    env = worker_env(cfg, NODE_1_OF_2, local_rank=1)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["TORCHELASTIC_RUN_ID"]) == ("h0", "7", "r7")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # static: the rendezvous store is the agent's


def test_a_workers_command_line_substitutes_its_local_rank(monkeypatch):
    program = parse_args(["--no-python", "testbed-train", "--out", "r${local_rank}.log"])
    assert worker_argv(program, 3) == ["testbed-train", "--out", "r3.log"]
    monkeypatch.setenv("PYTHON_EXEC", "/opt/py")
    assert worker_argv(parse_args(["-m", "pkg.train", "x"]), 0) == ["/opt/py", "-u", "-m", "pkg.train", "x"]


def test_on_an_emulated_host_only_its_programs_start_by_name(monkeypatch):
    monkeypatch.delenv(ALLOWLIST_ENV, raising=False)
    assert program_refusal(parse_args(["train.py"])) is None  # not on an emulated host: anything
    monkeypatch.setenv(ALLOWLIST_ENV, "testbed-train,sleep")
    assert program_refusal(parse_args(["--no-python", "testbed-train"])) is None
    assert "launch one by name with --no-python (allowed: testbed-train, sleep)" in program_refusal(
        parse_args(["train.py"])
    )
    assert program_refusal(parse_args(["--no-python", "/bin/sleep"])) == (
        "FileNotFoundError: [Errno 2] No such file or directory: '/bin/sleep'"
    )


def test_error_files_go_under_the_log_dir_or_a_temporary_one_in_the_hosts_home(tmp_path, monkeypatch):
    attempt, made = log_dirs(parse_args(["--log-dir", str(tmp_path / "logs"), "--rdzv-id", "r1", "p"]))
    assert made is None and os.path.isdir(attempt)
    assert os.path.basename(attempt) == "attempt_0" and os.path.basename(os.path.dirname(attempt)).startswith("r1_")
    monkeypatch.setenv(ALLOWLIST_ENV, "p")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    attempt, made = log_dirs(parse_args(["p"]))
    assert made is not None and made.startswith(str(tmp_path / "home" / ".tmp" / "torchelastic_"))
    assert attempt.startswith(made + os.sep)


@pytest.mark.timeout(60)
def test_workers_start_with_their_environment_and_the_monitor_sees_them_all_succeed(tmp_path, monkeypatch, workers):
    monkeypatch.setenv(ALLOWLIST_ENV, "not-for-workers")
    dump = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"
    cfg = python_workers(dump, str(tmp_path / "env.${local_rank}.json"))
    start_workers(cfg, NODE_1_OF_2, str(tmp_path / "attempt"), workers)
    assert [(w.local_rank, w.rank) for w in workers] == [(0, 2), (1, 3)]
    assert monitor(cfg, workers) == []
    for w in workers:
        env = json.loads((tmp_path / f"env.{w.local_rank}.json").read_text())
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(w.rank), str(w.local_rank))
        assert (
            env["TORCHELASTIC_ERROR_FILE"]
            == w.error_file
            == str(tmp_path / "attempt" / str(w.local_rank) / "error.json")
        )
        assert ALLOWLIST_ENV not in env  # the host's allowlist is the launcher's alone


@pytest.mark.timeout(60)
def test_the_monitor_reports_the_failed_worker_and_the_stop_ends_the_others(tmp_path, workers):
    fail_one = "import os, sys, time; sys.exit(3) if os.environ['LOCAL_RANK'] == '1' else time.sleep(60)"
    cfg = python_workers(fail_one)
    start_workers(cfg, NODE_1_OF_2, str(tmp_path), workers)
    failures = monitor(cfg, workers)
    assert [(w.local_rank, code) for w, code, _ in failures] == [(1, 3)]
    stop_workers(workers)
    assert workers[0].proc.returncode == -signal.SIGTERM
    report = failure_summary(cfg, failures)
    assert report.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")
    assert f"{sys.executable} FAILED" in report and "<NO_OTHER_FAILURES>" in report
    root = report.split("Root Cause (first observed failure):\n", 1)[1]
    assert "rank      : 3 (local_rank: 1)" in root
    assert f"exitcode  : 3 (pid: {workers[1].proc.pid})" in root


@pytest.mark.timeout(60)
def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, workers):
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    stubborn = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('ready'); time.sleep(60)"
    )
    start_workers(python_workers(stubborn, str(ready), nproc=1), NODE_1_OF_2, str(tmp_path), workers)
    with open(ready) as fifo:  # the worker ignores SIGTERM once it has written here
        assert fifo.read() == "ready"
    stop_workers(workers, timeout=0.2)
    assert workers[0].proc.returncode == -signal.SIGKILL
