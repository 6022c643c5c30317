"""The emulated host's torchrun (emulators/gpuhost/torchrun/): torchrun's command line (fuzzed: what it does
not know is refused as argparse refuses it, with status 2), a real rendezvous among the launchers, torchrun's
environment for each worker, a failed worker or a signal ending all of them, and the host's allowlist; and the
emulated host running it as `torchrun` over SSH, its workers in the job a lost GPU takes down.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.gpuhost import torchrun
from testbed.families.drivers import make_driver

PYTHON = sys.executable
STANDIN = [PYTHON, "-m", "emulators.gpuhost.torchrun"]
# each worker writes its environment to a file of its own (workers share torchrun's stdout)
ENV_DUMP = "import json, os; open(f'env.{os.getpid()}.json', 'w').write(json.dumps(dict(os.environ)))"
# one write(2) of a short line: atomic on a pipe shared with the other workers
SAY_PID = "import os, time; os.write(1, f'{os.getpid()}\\n'.encode()); "
# Every option name real torchrun knows (torch/distributed/run.py), so that the fuzz's unknown options are
# unknown to it too (argparse also takes a prefix of a name for the name).
REAL_OPTIONS = [n for _, names, *_ in (*torchrun.SUPPORTED, *torchrun.UNSUPPORTED) for n in names] + ["--help"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv: list[str]) -> tuple[torchrun.Config | None, int | None, str]:
    """(config, None, '') or (None, exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return torchrun.parse_args(argv), None, ""
        except SystemExit as exc:
            return None, exc.code, err.getvalue()


# --- the command line ------------------------------------------------------------------------------------


def test_the_command_testbed_writes_parses_as_torchrun_reads_it():
    argv = [
        *("--nnodes", "4", "--node-rank", "2", "--nproc-per-node", "1", "--rdzv-backend", "static"),
        *("--rdzv-endpoint", "10.0.0.1:29504", "--rdzv-id", "run-3", "--max-restarts", "0", "--no-python"),
        *("testbed-train", "--steps", "10", "--timeout", "5"),
    ]
    cfg, code, err = parse(argv)
    assert code is None, err
    assert (cfg.nnodes, cfg.node_rank, cfg.nproc_per_node, cfg.rdzv_backend) == (4, 2, 1, "static")
    assert (cfg.endpoint, cfg.run_id, cfg.max_restarts, cfg.no_python) == (("10.0.0.1", 29504), "run-3", 0, True)
    assert (cfg.program, cfg.args) == ("testbed-train", ["--steps", "10", "--timeout", "5"])
    # torchrun's underscore spellings and prefixes, and the static endpoint from --master-addr/--master-port
    cfg, code, err = parse(["--nproc_per_node=2", "--nnod", "1", "--master-port", "1234", "train.py"])
    assert code is None, err
    assert (cfg.nproc_per_node, cfg.nnodes, cfg.endpoint, cfg.no_python) == (2, 1, ("127.0.0.1", 1234), False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "1", "prog"], "unrecognized arguments: --bogus"),
        (["--no", "prog"], "ambiguous option: --no could match"),
        (["--tee", "3", "prog"], "argument -t/--tee: not supported by the emulated host's torchrun"),
        (["--nnodes", "1:4", "prog"], "elastic ranges are not supported"),
        (["--max-restarts", "3", "prog"], "only 0 is supported"),
        (["--nnodes", "2", "--node-rank", "2", "prog"], "--node-rank: 2 is not a node of --nnodes 2"),
        (["--node-rank", "x", "prog"], "argument --node-rank/--node_rank: invalid int value: 'x'"),
        (["--rdzv-backend", "etcd", "prog"], "'etcd' is not supported"),
        (["--rdzv-endpoint", "host", "prog"], "Port is absent in endpoint: host"),
        (["--no-python", "-m", "prog"], "Don't use both the '--no-python' flag and the '--module' flag"),
        ([], "the following arguments are required: training_script"),
    ],
)
def test_what_torchrun_would_not_run_is_refused_with_its_usage(argv, message):
    cfg, code, err = parse(argv)
    assert cfg is None and code == 2
    assert err.startswith("usage: torchrun ") and message in err.partition("\ntorchrun: error: ")[2]


OPTION_VALUES = {
    "--nnodes": st.integers(1, 64).map(str),
    "--nproc-per-node": st.integers(1, 8).map(str),
    "--rdzv-backend": st.sampled_from(["static", "c10d"]),
    # a value that starts with "-" is taken for an option by argparse, torchrun's as much as this one's
    "--rdzv-id": st.text("abcdefgh0123456789-_.", min_size=1, max_size=12).filter(lambda s: s[0] != "-"),
    "--max-restarts": st.just("0"),
    "--monitor-interval": st.sampled_from(["0.1", "0.5", "2"]),
    "--role": st.sampled_from(["default", "trainer"]),
    "--no-python": st.none(),
}
# a name no torchrun option starts with (argparse would take it for that option's abbreviation)
UNKNOWN = (
    st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10)
    .map(lambda s: "--" + s.lstrip("-"))
    .filter(lambda name: len(name) > 2 and not any(real.startswith(name) for real in REAL_OPTIONS))
)


def abbreviates_two_options(arg: str) -> bool:
    """An argument argparse refuses wherever it stands, after the program too (Python 3.11's argparse, torchrun's
    and the stand-in's: it resolves abbreviations before REMAINDER takes the program's arguments): `--n`, `--=`.
    """
    name = arg.split("=", 1)[0]
    return arg.startswith("--") and name not in REAL_OPTIONS and sum(o.startswith(name) for o in REAL_OPTIONS) > 1


# argparse drops a "--" right after the program (torchrun's REMAINDER does the same): not fuzzed here
PROGRAM_ARGS = st.lists(st.text("abcdefghij0123456789-=_.", max_size=8), max_size=5).filter(
    lambda a: a[:1] != ["--"] and not any(abbreviates_two_options(x) for x in a)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    options=st.dictionaries(st.sampled_from(sorted(OPTION_VALUES)), st.none(), max_size=len(OPTION_VALUES)).flatmap(
        lambda chosen: st.fixed_dictionaries({k: OPTION_VALUES[k] for k in chosen})
    ),
    unknown=st.none() | st.tuples(UNKNOWN, st.integers(0, 20), st.booleans()),
    args=PROGRAM_ARGS,
)
def test_fuzz_known_options_parse_and_an_unknown_one_is_refused(options, unknown, args):
    """Options torchrun has are read as torchrun reads them; any option it has not, anywhere before the
    program, is refused (exit 2), and everything after the program is the program's.
    """
    argv: list[str] = ["--rdzv-endpoint", "127.0.0.1:29400"]
    for name, value in options.items():
        argv += [name] if value is None else [name, value]
    if "--nnodes" in options and "--rdzv-backend" not in options:
        argv += ["--node-rank", "0"]
    if unknown is not None:
        name, at, with_value = unknown
        pos = min(at, len(argv))
        while pos and pos < len(argv) and not argv[pos].startswith("--"):
            pos -= 1  # an option's name, not between a name and its value
        argv[pos:pos] = [name, "7"] if with_value else [name]
    argv += ["prog", *args]
    cfg, code, err = parse(argv)
    if unknown is not None:
        assert cfg is None and code == 2 and f"torchrun: error: unrecognized arguments: {unknown[0]}" in err
        return
    assert code is None, err
    assert (cfg.program, cfg.args) == ("prog", args)
    assert cfg.nnodes == int(options.get("--nnodes", "1"))
    assert cfg.nproc_per_node == int(options.get("--nproc-per-node", "1"))
    assert cfg.rdzv_backend == options.get("--rdzv-backend", "static")
    assert cfg.run_id == options.get("--rdzv-id", "none")
    assert cfg.no_python == ("--no-python" in options)
    assert cfg.endpoint == ("127.0.0.1", 29400)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=st.lists(st.one_of(st.sampled_from(REAL_OPTIONS + ["prog", "--", "-", "1", "0:2"]), st.text(max_size=6))))
def test_fuzz_any_command_line_is_parsed_or_refused_never_a_crash(argv):
    cfg, code, err = parse(argv)
    assert cfg is not None or code in (0, 2)  # 0: --help
    if cfg is not None:
        assert cfg.nnodes >= 1 and cfg.nproc_per_node >= 1 and cfg.max_restarts == 0
        assert 0 <= cfg.endpoint[1] <= 65535


# --- rendezvous and workers ------------------------------------------------------------------------------


def launch(argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*STANDIN, *argv],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def environments(folder: Path) -> list[dict[str, str]]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("env.*.json"))]


@pytest.mark.timeout(60)
def test_launchers_meet_and_each_worker_gets_torchruns_environment(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "j7"]
    # node 1 first: it waits for node 0's store to come up
    procs = [
        launch([*common, "--node-rank", str(n), "--no-python", PYTHON, "-c", ENV_DUMP], cwd=tmp_path) for n in (1, 0)
    ]
    outs = [p.communicate(timeout=30) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    envs = {int(env["RANK"]): env for env in environments(tmp_path)}
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, env in envs.items():
        assert env["LOCAL_RANK"] == str(rank % 2) and env["GROUP_RANK"] == str(rank // 2)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4" and env["ROLE_RANK"] == str(rank)
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2" and env["ROLE_NAME"] == "default"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))  # static: the endpoint
        assert env["TORCHELASTIC_RUN_ID"] == "j7" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank % 2}/error.json")
        assert env["OMP_NUM_THREADS"] == "1"  # torchrun's default with more than one worker per node


@pytest.mark.timeout(60)
def test_c10d_ranks_nodes_by_address_and_pid_not_by_node_rank(tmp_path):
    """As DynamicRendezvousHandler does: --node-rank is ignored, node 0 is the lowest (address, pid), and
    MASTER_ADDR / MASTER_PORT are node 0's address and a port it holds.
    """
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "c"]
    common += ["--local-addr", "127.0.0.1"]
    procs = [
        launch([*common, "--node-rank", "1", "--no-python", PYTHON, "-c", ENV_DUMP], cwd=tmp_path / str(i))
        for i in range(2)
        if (tmp_path / str(i)).mkdir() is None
    ]
    outs = [p.communicate(timeout=30) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    envs = [environments(tmp_path / str(i))[0] for i in range(2)]
    lower = min(range(2), key=lambda i: procs[i].pid)
    assert envs[lower]["GROUP_RANK"] == envs[lower]["RANK"] == "0" and envs[1 - lower]["RANK"] == "1"
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1
    assert envs[0]["MASTER_PORT"] != str(port) and envs[0]["TORCHELASTIC_USE_AGENT_STORE"] == "False"


@pytest.mark.timeout(60)
def test_a_launcher_waits_for_every_node_until_the_rendezvous_timeout():
    port = free_port()
    t0 = time.monotonic()
    proc = launch(["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "timeout=1"] + ["true"])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    # Ended by the rendezvous timeout it was given (its message says which): not before it, however late a busy
    # machine lets it end.
    assert "Timed out after 1 seconds waiting for clients. 1/2 clients joined." in err
    assert time.monotonic() - t0 >= 1.0


@pytest.mark.timeout(60)
def test_a_failed_worker_stops_the_others_and_torchrun_fails_with_its_summary(tmp_path):
    # local rank 0 says it is up (a file with its pid) and waits; local rank 1 fails once it sees that
    code = (
        "import os, sys, time\n"
        "if os.environ['LOCAL_RANK'] == '0':\n"
        "    open('up.tmp', 'w').write(str(os.getpid())); os.rename('up.tmp', 'up'); time.sleep(60)\n"
        "while not os.path.exists('up'): time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    argv = ["--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--no-python", PYTHON, "-c"]
    proc = launch([*argv, code], cwd=tmp_path)
    _, err = proc.communicate(timeout=40)  # well inside the survivor's 60 s: it was stopped
    assert proc.returncode == 1
    assert "ChildFailedError" in err and "rank      : 1 (local_rank: 1)" in err and "exitcode  : 3" in err
    assert "Failures:\n  <NO_OTHER_FAILURES>" in err  # the survivor, stopped by torchrun, is no failure
    assert not _alive(int((tmp_path / "up").read_text()))


@pytest.mark.timeout(60)
def test_sigterm_to_torchrun_alone_reaches_its_workers_and_it_exits_1():
    code = SAY_PID + "time.sleep(60)"
    argv = ["--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--no-python", PYTHON, "-c"]
    proc = launch([*argv, code], start_new_session=True)
    pids = [int(proc.stdout.readline()) for _ in range(2)]  # both workers are up
    proc.send_signal(signal.SIGTERM)  # to torchrun's pid only, not its process group
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 1
    assert f"SignalException: Process {proc.pid} got signal: {int(signal.SIGTERM)}" in err
    assert not any(_alive(pid) for pid in pids)


def test_on_an_emulated_host_it_starts_only_the_hosts_programs():
    env = {torchrun.ALLOWLIST_ENV: "testbed-train,sleep"}
    argv = ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    proc = launch([*argv, "--no-python", "rm", "-rf", "x"], env)
    assert proc.communicate(timeout=30)[1].strip() == "FileNotFoundError: [Errno 2] No such file or directory: 'rm'"
    assert proc.returncode == 1
    proc = launch([*argv, "script.py"], env)
    assert "launch one by name with --no-python (allowed: testbed-train, sleep)" in proc.communicate(timeout=30)[1]
    assert proc.returncode == 1


# --- on the emulated host, over SSH ----------------------------------------------------------------------


@pytest.fixture
def driver(settings):
    drv = make_driver("ssh", "gpu01", settings, lambda record: None)
    yield drv
    drv.close()


def _workers(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


@pytest.mark.timeout(60)
def test_the_emulated_host_runs_torchrun_and_a_lost_gpu_takes_its_workers(driver, gpu_host):
    r = driver.exec("torchrun --bogus 1 --no-python sleep 1", check=False)
    assert r.status == 2 and "torchrun: error: unrecognized arguments: --bogus" in r.stderr
    command = ["torchrun", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--no-python"]
    job = driver.run_job([*command, "sleep", "60"], name="launcher", gpus=[0, 1])
    assert [(p.pid, p.name) for p in driver.processes()] == [(job.pid, "torchrun")] * 2  # it holds both GPUs
    deadline = time.monotonic() + 20
    while len(workers := _workers(job.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # poll until the launcher has started both workers (the rendezvous comes first)
    assert len(workers) == 2
    env = Path(f"/proc/{workers[0]}/environ").read_bytes().decode().split("\0")
    assert torchrun.ALLOWLIST_ENV not in {item.split("=", 1)[0] for item in env}  # the host's, not the ranks'
    gpu_host.fail_gpu(1)
    gpu_host.engine.jobs[job.pid].proc.wait(10)
    assert driver.job_status(job).state == "exited"
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.02)  # SIGKILL to the process group: the kernel reaps the workers (init adopts them)
    assert not any(_alive(pid) for pid in workers)


# --- testbed-train under torchrun ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_testbed_train_takes_torchruns_contract_without_rank_arguments(tmp_path):
    """RANK, WORLD_SIZE and LOCAL_RANK from torchrun, the ring's addresses from TESTBED_PEERS (passed on by
    torchrun); each rank writes its output to its own log (TESTBED_RANK_LOG), and they learn together.
    """
    peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    env = {"TESTBED_PEERS": peers, "TESTBED_RANK_LOG": "logs/rank{rank}.log"}
    argv = ["--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--no-python"]
    proc = launch([*argv, PYTHON, "-m", "hostside.train", "--steps", "5", "--timeout", "10"], env, cwd=tmp_path)
    out, err = proc.communicate(timeout=50)
    assert proc.returncode == 0, err
    assert "step" not in out  # the ranks' output is in their own logs
    logs = [(tmp_path / "logs" / f"rank{r}.log").read_text() for r in range(2)]
    for rank, log in enumerate(logs):
        assert log.startswith(f"rank {rank}/2 starting pid ") and f" local_rank={rank}\n" in log.splitlines(True)[0]
        assert f"done rank {rank} steps 5" in log
    losses = [[line for line in log.splitlines() if line.startswith("step ")] for log in logs]
    assert len(losses[0]) == 5 and losses[0] == losses[1]


def test_testbed_train_says_where_the_ring_is_missing():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env.pop("TESTBED_PEERS", None)
    proc = subprocess.run(
        [PYTHON, "-m", "hostside.train"], env={**env, "MASTER_PORT": "1"}, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Give --peers, --hostfile or TESTBED_PEERS" in proc.stderr
