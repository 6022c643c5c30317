"""`launcher: direct`: testbed starts every rank itself, one process per rank on its host's GPU, each with
PyTorch's rendezvous variables and testbed's in its environment (docs/jobs.md).
"""

from __future__ import annotations

from testbed.engine.job.launcher import Launch, Programs, Started
from testbed.engine.job.ranks import Rank


def rank_environment(launch: Launch, r: Rank) -> dict[str, str]:
    """The environment rank r is started with: the playbook's, then torch.distributed's env:// variables, then
    testbed's (its peers, the checkpoints, the fabric service, and what the step adds).
    """
    layout = launch.layout
    return {
        **launch.job.env,
        "RANK": str(r.index),
        "WORLD_SIZE": str(len(layout.ranks)),
        "LOCAL_RANK": str(r.local),
        "LOCAL_WORLD_SIZE": str(layout.per_host[r.host]),
        "MASTER_ADDR": layout.master_address,
        "MASTER_PORT": str(layout.master_port),
        "TESTBED_MASTER_HOST": layout.master,
        "TESTBED_PEERS": ",".join(layout.peers_of(r)),
        "TESTBED_CHECKPOINT_DIR": launch.job.checkpoint_dir,
        **launch.service_env(r.host),
        **launch.extra_env(r),
    }


def rank_job_name(launch: Launch, r: Rank) -> str:
    return f"rank{r.index}.{launch.number}"


class DirectLauncher:
    def programs(self, launch: Launch) -> Programs:
        programs: Programs = {}
        for r in launch.ranks:
            args = {
                "command": list(launch.job.command),
                "name": rank_job_name(launch, r),
                "gpus": [r.local],
                "env": rank_environment(launch, r),
                # a rank slot keeps its directory across a start's relaunches, so its checkpoints are found again
                "workdir": launch.workdir(f"rank{r.index}"),
            }
            programs.setdefault(r.host, []).append((launch.label, "gpu.start_job", args))
        if launch.watch is not None:
            watched = launch.ranks[launch.watch]
            programs[watched.host].append(launch.watch_step(rank_job_name(launch, watched)))
        return programs

    def started(self, launch: Launch, results: dict[str, list]) -> Started:
        out = Started()
        for host, host_results in results.items():
            on_host = [r for r in launch.ranks if r.host == host]
            for r, result in zip(on_host, host_results[: len(on_host)], strict=True):
                if result is not None and result.status == "ok":
                    out.handles[r.index] = result.value
                out.results[r.index] = result
            if launch.watch is not None and host == launch.ranks[launch.watch].host:
                out.watched = host_results[len(on_host)]
        out.failures = list(out.results.values())  # the watch's failure is the caller's to raise, after its marks
        return out

    def stop_programs(
        self, label: str, ranks: list[Rank], handles: dict[int, dict], launchers: dict[str, dict]
    ) -> Programs:
        programs: Programs = {}
        for r in ranks:
            if r.index in handles:
                programs.setdefault(r.host, []).append((label, "gpu.stop_job", {"job": handles[r.index]}))
        return programs
