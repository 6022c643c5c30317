"""`launcher: torchrun`: one torchrun per host, all at once, each starting its host's ranks (docs/jobs.md).

Node i is the i-th host in rank order, so rank 0's host is node 0 and hosts the rendezvous (torchrun's static
backend: node ranks are the --node-rank given, the store is node 0's at the endpoint, and MASTER_ADDR /
MASTER_PORT are that endpoint). Every launch has a rendezvous id of its own. The ranks get torchrun's variables
from torchrun, and testbed's (TESTBED_PEERS, ...) through torchrun's environment, which its workers inherit.

A rank is watched through its host's torchrun (the process the host started, which exits when a worker fails
and whose process group a fault or a stop signals) and the rank's own output: the launcher's log when the host
runs one rank, whose output is torchrun's, else the file the rank writes itself (TESTBED_RANK_LOG;
testbed-train does).
"""

from __future__ import annotations

import re

from testbed.contracts.errors import StepFailed
from testbed.engine.job.launcher import Launch, Programs, Started
from testbed.engine.job.ranks import Rank


def nodes(launch: Launch) -> list[str]:
    """The hosts in rank order: node i is the i-th."""
    return list(dict.fromkeys(r.host for r in launch.ranks))


def ranks_per_node(launch: Launch) -> int:
    """torchrun's --nproc-per-node: the same on every host (the playbook's check)."""
    return launch.layout.per_host[launch.layout.master]


def rendezvous_id(launch: Launch) -> str:
    """The run's id made a valid rendezvous id, numbered by launch."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', str(launch.run_id))}-{launch.number}"


def host_environment(launch: Launch, host: str) -> dict[str, str]:
    """The environment of `host`'s torchrun, which its workers inherit: the playbook's, then testbed's (the
    peers as every rank of the host sees them, the checkpoints, the fabric service, and what the step adds for
    each of the host's ranks, merged).
    """
    layout = launch.layout
    env = {
        **launch.job.env,
        "TESTBED_MASTER_HOST": layout.master,
        "TESTBED_PEERS": ",".join(layout.host_peers(host)),
        "TESTBED_CHECKPOINT_DIR": launch.job.checkpoint_dir,
        **launch.service_env(host),
    }
    for r in launch.ranks:
        if r.host == host:
            env.update(launch.extra_env(r))
    if ranks_per_node(launch) > 1:
        env["TESTBED_RANK_LOG"] = f"rank{{rank}}.{launch.number}.log"  # in its workdir
    return env


def torchrun_command(launch: Launch, node: int) -> list[str]:
    """Node `node`'s torchrun command line, which runs the job's command on each of its ranks."""
    layout = launch.layout
    endpoint = f"{layout.master_address}:{layout.master_port}"
    return [
        "torchrun",
        *("--nnodes", str(len(nodes(launch))), "--node-rank", str(node)),
        *("--nproc-per-node", str(ranks_per_node(launch))),
        *("--rdzv-backend", "static", "--rdzv-endpoint", endpoint, "--rdzv-id", rendezvous_id(launch)),
        *("--max-restarts", "0", "--no-python"),
        *launch.job.command,
    ]


def rank_handle(launch: Launch, r: Rank, launcher: dict) -> dict:
    """Rank r's job handle: its host's torchrun, with the rank's own log when the host runs several ranks."""
    if ranks_per_node(launch) == 1:
        return dict(launcher)
    log = f"{launcher['workdir']}/rank{r.index}.{launch.number}.log"
    return {**launcher, "name": f"rank{r.index}.{launch.number}", "log": log}


class TorchrunLauncher:
    def programs(self, launch: Launch) -> Programs:
        nproc = ranks_per_node(launch)
        if launch.watch is not None and nproc > 1:
            raise StepFailed(
                f"{launch.label}: watching a rank's relaunch under torchrun needs one rank per host (here {nproc})"
            )
        programs: Programs = {}
        for i, host in enumerate(nodes(launch)):
            env = host_environment(launch, host)
            name = f"node{i}.{launch.number}"
            args = {"command": torchrun_command(launch, i), "name": name, "gpus": list(range(nproc)), "env": env}
            programs[host] = [(launch.label, "gpu.start_job", {**args, "workdir": launch.workdir(f"node{i}")})]
            if launch.watch is not None and host == launch.ranks[launch.watch].host:
                programs[host].append(launch.watch_step(name))
        return programs

    def started(self, launch: Launch, results: dict[str, list]) -> Started:
        out = Started()
        for host, host_results in results.items():
            launched = host_results[0]
            if launched is not None and launched.status == "ok":
                out.launchers[host] = launched.value
            for r in launch.ranks:
                if r.host == host:
                    out.results[r.index] = launched
                    if host in out.launchers:
                        out.handles[r.index] = rank_handle(launch, r, out.launchers[host])
            if launch.watch is not None and host == launch.ranks[launch.watch].host:
                out.watched = host_results[1]
        out.failures = list({id(v): v for v in out.results.values()}.values())  # each launcher's once
        return out

    def stop_programs(
        self, label: str, ranks: list[Rank], handles: dict[int, dict], launchers: dict[str, dict]
    ) -> Programs:
        # each host's torchrun, which stops its workers (SIGTERM)
        return {host: [(label, "gpu.stop_job", {"job": handle})] for host, handle in launchers.items()}
