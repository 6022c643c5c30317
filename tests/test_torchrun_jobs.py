"""Jobs launched by torchrun (`launcher: torchrun`) on emulated GPU hosts, over real SSH through the twin and
the in-process engine of tests/test_engine_local.py: one torchrun per host (the emulated host's stand-in,
emulators/gpuhost/torchrun/, as CI has no PyTorch) starts that host's ranks, which get torchrun's
environment; each rank's pid, environment and own step lines are observable; a failover that loses rank 0's
host relaunches every host's torchrun with the spare as node 0 (the rendezvous and MASTER_ADDR move to it).
With PyTorch installed, the same failover runs real gloo ranks under PyTorch's own torchrun.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from peers import require_peer
from test_engine_local import REPO, _environ, _write, engine_for

from testbed.documents import load_inventory, load_playbook
from testbed.events import Op
from testbed.plan import make_plan
from testbed.results.milestones import MILESTONES
from testbed.twin.bridge import start_twin

pytestmark = pytest.mark.timeout(240)

TRAIN = ["testbed-train", "--steps", "1000000", "--dim", "16", "--step-time", "0.02", "--checkpoint-every", "10"]
TRAIN += ["--timeout", "10"]
# torchrun's variables, as LocalElasticAgent sets them for a worker (the documented ones, and the rest it sets)
TORCHRUN_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
}


def _workers(launcher_pid: int) -> list[int]:
    """The processes a launcher started (its ranks), from the kernel's process table."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            if int(stat.rsplit(")", 1)[1].split()[1]) == launcher_pid:
                found.append(int(entry.name))
    return sorted(found)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _ranks(jobs) -> dict[int, tuple[str, int, dict[str, str]]]:
    """Every running rank: global rank -> (host, pid, environment), read from the launchers' workers."""
    out = {}
    for host, launcher in jobs.launchers.items():
        for pid in _workers(launcher["pid"]):
            env = _environ(pid)
            out[int(env["RANK"])] = (host, pid, env)
    return out


def _listening(port: int) -> set[int]:
    """The socket inodes listening on 127.0.0.1:port (/proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":  # 127.0.0.1, LISTEN
            found.add(int(fields[9]))
    return found


def _rendezvous_host(jobs) -> str:
    """The host whose torchrun serves the rendezvous: it holds the socket listening on the endpoint's port."""
    (port,) = {int(_option(_cmdline(h["pid"]), "--rdzv-endpoint").rpartition(":")[2]) for h in jobs.launchers.values()}
    inodes = _listening(port)
    serving = []
    for host, launcher in jobs.launchers.items():
        fds = Path(f"/proc/{launcher['pid']}/fd")
        links = {str(fd.readlink()) for fd in fds.iterdir() if fd.is_symlink()}
        if any(f"socket:[{inode}]" in links for inode in inodes):
            serving.append(host)
    (host,) = serving
    return host


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _plan(tmp_path: Path, data: dict):
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    playbook = load_playbook(_write(tmp_path / "playbook.yaml", data), base).model
    return make_plan(playbook, base, trials=1)


def test_torchrun_starts_each_hosts_ranks_with_its_environment(tmp_path):
    """Two hosts, two ranks each: one torchrun per host; every rank's /proc/PID/environ has torchrun's
    variables (and testbed's, passed through torchrun), and each rank writes its step lines to its own log.
    """
    data = {
        "name": "torchrun-job",
        "trials": 1,
        "job": {"command": TRAIN, "ranks": ["gpu01", "gpu01", "gpu02", "gpu02"], "launcher": "torchrun"},
        "steps": [{"action": "job.start", "wait_steps": 5}, {"action": "job.stop"}],
    }
    plan = _plan(tmp_path, data)
    job_start, job_stop = plan.trials[0].steps
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        jobs = coordinator.jobs
        try:
            coordinator.execute_steps([job_start])  # waits for step 5 in every rank's own log
            launchers = dict(jobs.launchers)
            handles = dict(jobs.handles)
            ranks = _ranks(jobs)
            homes = {host: Path(twin.call(host, "state")["home"]) for host in launchers}
            logs = {r: (homes[h["host"]] / h["log"]).read_text() for r, h in handles.items()}
            argv = {host: _cmdline(launcher["pid"]) for host, launcher in launchers.items()}
            coordinator.execute_steps([job_stop])
            gone = not any(_alive(pid) for _, pid, _ in ranks.values()) and not any(
                _alive(launcher["pid"]) for launcher in launchers.values()
            )
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    assert sorted(launchers) == ["gpu01", "gpu02"]
    assert sorted(ranks) == [0, 1, 2, 3]
    port = _option(argv["gpu01"], "--rdzv-endpoint").rpartition(":")[2]
    for rank, (host, pid, env) in ranks.items():
        node = rank // 2
        assert host == ("gpu01", "gpu02")[node]
        assert TORCHRUN_VARS <= set(env)
        assert env["LOCAL_RANK"] == str(rank % 2) and env["GROUP_RANK"] == str(node)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4" and env["ROLE_RANK"] == str(rank)
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", port)  # rank 0's host, the endpoint
        assert env["TORCHELASTIC_RUN_ID"] == "local-1" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        # testbed's own variables reach the ranks through torchrun
        assert env["TESTBED_MASTER_HOST"] == "gpu01" and len(env["TESTBED_PEERS"].split(",")) == 4
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        # the rank's own log: its own start line (its pid) and its steps
        assert f"rank {rank}/4 starting pid {pid} " in logs[rank]
        assert "\nstep 5 loss " in logs[rank]
        assert handles[rank]["pid"] == launchers[host]["pid"]  # watched through its host's torchrun
    for host, node in (("gpu01", "0"), ("gpu02", "1")):
        assert argv[host][3:] == [
            *("--nnodes", "2", "--node-rank", node, "--nproc-per-node", "2"),
            *("--rdzv-backend", "static", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "local-1"),
            *("--max-restarts", "0", "--no-python", *TRAIN),
        ]
    assert gone  # job.stop stopped every torchrun, and they their ranks


def test_a_failover_of_rank_0s_host_moves_the_rendezvous_to_the_spare(tmp_path):
    """Rank 0's host is lost: every host's torchrun is relaunched with the spare as node 0, a new rendezvous
    id, and MASTER_ADDR / MASTER_PORT at the spare's endpoint; every failover milestone is still measured, and
    the ranks resume from the checkpoint.
    """
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    data = load_playbook(REPO / "playbooks/gpu-failover.yaml", base).model.model_dump(mode="json", exclude_unset=True)
    data["job"]["launcher"] = "torchrun"
    data["steps"][1]["fault"]["target"] = "rank:0"
    plan = _plan(tmp_path, data)
    job_start, failover, job_stop = plan.trials[0].steps
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        jobs = coordinator.jobs
        try:
            coordinator.execute_steps([job_start])
            before, hosts_before = _ranks(jobs), list(jobs.assignment)
            argv_before = {host: _cmdline(h["pid"]) for host, h in jobs.launchers.items()}
            served_before = _rendezvous_host(jobs)
            coordinator.execute_steps([failover])
            after, hosts_after = _ranks(jobs), list(jobs.assignment)
            argv_after = {host: _cmdline(h["pid"]) for host, h in jobs.launchers.items()}
            served_after = _rendezvous_host(jobs)
            spare = jobs.ranks[0].host
            coordinator.execute_steps([job_stop])
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    assert spare in ("gpu09", "gpu10")  # rank 0's host was replaced
    assert hosts_before == ["gpu01", "gpu02", "gpu03", "gpu04"] and hosts_after == [spare, "gpu02", "gpu03", "gpu04"]
    for ranks, argv, hosts in ((before, argv_before, hosts_before), (after, argv_after, hosts_after)):
        master = hosts[0]
        assert sorted(ranks) == [0, 1, 2, 3]
        port = _option(argv[master], "--rdzv-endpoint").rpartition(":")[2]
        assert _option(argv[master], "--node-rank") == "0"  # node 0: rank 0's host, which serves the rendezvous
        assert {_option(a, "--rdzv-endpoint") for a in argv.values()} == {f"127.0.0.1:{port}"}
        for rank, (host, _, env) in ranks.items():
            assert host == hosts[rank]  # node i is the i-th host, its torchrun's --node-rank
            assert _option(argv[host], "--node-rank") == str(rank)
            assert env["GROUP_RANK"] == env["RANK"] == str(rank) and env["LOCAL_RANK"] == "0"
            assert env["TESTBED_MASTER_HOST"] == master
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", port)
    runs = {env["TORCHELASTIC_RUN_ID"] for ranks in (before, after) for _, _, env in ranks.values()}
    assert len(runs) == 2  # the relaunch is a rendezvous of its own
    assert (served_before, served_after) == ("gpu01", spare)  # the rendezvous store moved to the spare
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    marks = [e["op"] for e in events if e["type"] == "mark"]
    assert all(m in marks for m in MILESTONES)
    resumed = next(e for e in events if e["op"] == Op.FAILOVER_RESUMED)
    assert resumed["device"] == spare and resumed["data"]["rank"] == 0 and resumed["data"]["resumed_from"] > 0
    starts = [e for e in events if e["op"] == "gpu.start_job" and e["type"] == "ok"]
    assert len(starts) == 8  # one torchrun per host, twice


def test_a_failover_of_real_gloo_ranks_under_pytorchs_torchrun(tmp_path):
    """With PyTorch: the emulated hosts hand `torchrun` to PyTorch's own (TESTBED_TWIN_TORCHRUN=real), and
    testbed-train sums its gradients with torch.distributed's gloo all_reduce, its process group set up by
    env:// from torchrun's MASTER_ADDR / MASTER_PORT. Rank 0's host is lost; the job resumes on the spare.
    """
    require_peer("torch", "a real gloo job needs PyTorch (pip install 'testbed[torch]')")
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    data = load_playbook(REPO / "playbooks/gpu-failover.yaml", base).model.model_dump(mode="json", exclude_unset=True)
    data["job"].update(launcher="torchrun", env={"TESTBED_TWIN_TORCHRUN": "real"})
    data["job"]["command"] = [*TRAIN, "--backend", "gloo"]
    data["steps"][1]["fault"]["target"] = "rank:0"
    plan = _plan(tmp_path, data)
    job_start, failover, job_stop = plan.trials[0].steps
    with start_twin(plan, None) as (inventory, twin):
        coordinator, dispatcher, recorder = engine_for(plan, inventory, twin, tmp_path)
        jobs = coordinator.jobs
        try:
            coordinator.execute_steps([job_start])
            before = _ranks(jobs)
            coordinator.execute_steps([failover])
            after = _ranks(jobs)
            spare = jobs.ranks[0].host
            coordinator.execute_steps([job_stop])
        finally:
            coordinator.close()
            dispatcher.close()
            recorder.close()
    assert sorted(before) == sorted(after) == [0, 1, 2, 3]
    assert before[0][0] == "gpu01" and after[0][0] == spare
    assert before[0][2]["TORCHELASTIC_RUN_ID"] != after[0][2]["TORCHELASTIC_RUN_ID"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all(m in [e["op"] for e in events if e["type"] == "mark"] for m in MILESTONES)
    resumed = next(e for e in events if e["op"] == Op.FAILOVER_RESUMED)
    assert resumed["device"] == spare and resumed["data"]["resumed_from"] > 0


@pytest.mark.parametrize(
    ("ranks", "line", "message"),
    [
        (["gpu01", "gpu02", "gpu01"], 7, "job.ranks[2]: with launcher: torchrun a host's ranks must be consecutive"),
        (["gpu01", "gpu01", "gpu02"], 4, "job.ranks: with launcher: torchrun every host runs as many ranks"),
    ],
)
def test_a_torchrun_layout_torchrun_cannot_launch_is_refused_at_its_line(tmp_path, ranks, line, message):
    from testbed.contracts.errors import ConfigError

    path = tmp_path / "playbook.yaml"
    path.write_text(
        "name: t\njob:\n  command: [testbed-train]\n  ranks:\n"
        + "".join(f"    - {host}\n" for host in ranks)
        + "  launcher: torchrun\nsteps:\n  - {action: job.start}\n"
    )
    base = load_inventory(REPO / "playbooks/inventory/emulated-rack.yaml").model
    with pytest.raises(ConfigError) as err:
        load_playbook(path, base)
    assert f"{path}:{line}: {message}" in str(err.value)
