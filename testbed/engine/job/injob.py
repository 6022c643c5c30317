"""In-job recovery (`job.recovery: in-job`), the controller's side: the store that outlives every rank, the
generations of members it holds, and the parked spares.

The controller (the process that runs the steps) serves a `torch.distributed.TCPStore` for each job.start, from
before the ranks start until job.stop (or the run's end), listening where every host of the job reaches it, as the
fabric service does (testbed/fabric_service/addresses.py; under --netns the hosts' namespaces reach it on their
bridge). Every process of the job finds it in its environment: TESTBED_RECOVERY=in-job, TESTBED_STORE (the address
its host reaches), TESTBED_SLOT (its host's name: a slot is a host's place in the job), and TESTBED_SPARE=1 on a
spare. The keys are hostside/membership.py's: generation 0 (each rank's host in its slot) is published before the
ranks start; a failover marks the current generation aborted the moment the failure is seen and publishes the next,
the spare in the failed slot, once the fabric is rewired (testbed/steps/failover.py).

PyTorch is imported here only when a job recovers in-job.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hostside import membership
from testbed.config.sections import Job
from testbed.contracts.errors import StepFailed, raise_failures
from testbed.documents.inventory import Inventory
from testbed.engine.device_actor import OpResult
from testbed.engine.job.launcher import READY
from testbed.engine.job.lighthouse import Lighthouse
from testbed.engine.job.ranks import Rank
from testbed.events import Op
from testbed.fabric.jobfabric import fabric_links
from testbed.fabric_service.addresses import service_addresses
from testbed.fabric_service.serving import ServedFabric

# What a parked spare prints once PyTorch is imported and its model built (hostside/torch_injob.py): followed as a
# step (group 1) so that job.start waits for it with the machinery that waits for a rank's steps.
PARKED = r"^spare parked slot \S+ waiting for generation (\d+)"
# The bound of the store's own operations from the controller (a set, a get): the store is this process's.
STORE_TIMEOUT_S = 30.0


def spare_job_name(host: str, start: int) -> str:
    return f"spare-{host}.{start}"


class JobStore:
    """The controller's TCPStore for one job.start and the generations published in it."""

    def __init__(self, hosts: Mapping[str, str], controller_address: str | None, members: list[str]) -> None:
        """`hosts`: every host a process of the job runs on -> its address as this machine reaches it;
        `members`: generation 0's slots in rank order (published at once).
        """
        try:
            import torch.distributed as dist
        except ImportError as exc:
            raise StepFailed(
                f"recovery: in-job needs PyTorch on the controller, which holds the job's store ({exc}): "
                "pip install 'testbed[torch]'"
            ) from None
        listen, self.advertised = service_addresses(dict(hosts), controller_address)
        try:
            self._store: object | None = dist.TCPStore(
                listen,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
            )
        except RuntimeError as exc:
            raise StepFailed(f"recovery: in-job: the job's store could not listen on {listen}: {exc}") from None
        self.port = int(self._store.port)
        self.generation = membership.Generation(0, {slot: rank for rank, slot in enumerate(members)})
        membership.publish(self._store, self.generation)

    @property
    def _server(self):
        if self._store is None:
            raise StepFailed("in-job recovery: the job's store is closed (job.stop closed it)")
        return self._store

    def address(self, host: str) -> str:
        """host:port where `host` reaches the store."""
        return f"{self.advertised[host]}:{self.port}"

    def env(self, host: str, *, spare: bool = False) -> dict[str, str]:
        """What a process of the job on `host` finds the store and its slot by."""
        env = {"TESTBED_RECOVERY": "in-job", "TESTBED_STORE": self.address(host), "TESTBED_SLOT": host}
        return {**env, "TESTBED_SPARE": "1"} if spare else env

    def abort(self, reason: str) -> int:
        """Mark the current generation broken (its members leave its process group); its number."""
        membership.abort(self._server, self.generation.number, reason)
        return self.generation.number

    def replace(self, failed: str, spare: str, reason: str) -> membership.Generation:
        """Publish the next generation: `spare` in slot `failed`'s place, every other member in its own."""
        try:
            nxt = self.generation.replaced(failed, spare)
        except membership.MembershipError as exc:
            raise StepFailed(f"in-job recovery: {exc}") from None
        membership.publish(self._server, nxt, reason)
        self.generation = nxt
        return nxt

    def put(self, key: str, value: str) -> None:
        """Write a key every process of the job reads (e.g. where TorchFT's lighthouse listens)."""
        self._server.set(key, value)

    def close(self) -> None:
        """Stop serving: the server ends with its last reference (TCPStore has no close of its own)."""
        self._store = None


class InJobRecovery:
    """The job controller's in-job steps (testbed/engine/job/controller.py's JobController is one): the store from
    job.start to job.stop, the parked spares, the generation aborted and the next one published by a failover.
    """

    c: Any  # testbed.engine.coordinator.Coordinator
    job: Job
    management_of: Callable[[str], str]
    inventory: Inventory | None
    link: Any
    commit: Callable[[list], None] | None
    starts: int
    served: ServedFabric | None
    store: JobStore | None
    spares: dict[str, dict]
    lighthouse: Lighthouse | None

    if TYPE_CHECKING:  # the controller's read-only views, which its own methods change (JobController defines them)

        @property
        def assignment(self) -> list[str]: ...

        @property
        def ranks(self) -> list[Rank]: ...

        @property
        def handles(self) -> dict[int, dict]: ...

    def _reach(self) -> tuple[dict[str, str], str | None]:
        """Every host a process of the job runs on -> its address as this machine reaches it, and the controller's
        address on a lab (None: found from the hosts' routes): where the store and the lighthouse listen.
        """
        hosts = {h: self.management_of(h) for h in dict.fromkeys([*self.job.ranks, *self._spare_hosts()])}
        on_lab = self.link is None and self.inventory is not None
        controller = self.inventory.controller_address if self.inventory is not None and on_lab else None
        return hosts, controller

    def open_store(self) -> None:
        """The job's store for this job.start, generation 0 published: each rank's host in its slot."""
        self.close_service_store()
        hosts, controller = self._reach()
        self.store = JobStore(hosts, controller, list(self.assignment))

    def open_lighthouse(self) -> None:
        """job.torchft: TorchFT's lighthouse for this job.start, listening where the job's store does, its port
        written into the store, where every replica group and every named spare finds it (lighthouse.py).
        """
        from hostside.torchft_train import LIGHTHOUSE_KEY

        assert self.store is not None and self.job.torchft is not None  # torchft needs recovery: in-job (sections.py)
        self.close_lighthouse()
        hosts, controller = self._reach()
        listen, _ = service_addresses(hosts, controller)  # as the store's
        self.lighthouse = Lighthouse(listen, self.job.torchft, len(self.ranks))
        self.store.put(LIGHTHOUSE_KEY, str(self.lighthouse.port))

    def close_lighthouse(self) -> None:
        """End TorchFT's lighthouse, if one runs."""
        lighthouse, self.lighthouse = self.lighthouse, None
        if lighthouse is not None:
            lighthouse.close()

    def close_service_store(self) -> None:
        """Stop serving the in-job store, if one is open."""
        store, self.store = self.store, None
        if store is not None:
            store.close()

    def _spare_hosts(self) -> list[str]:
        """The hosts a failover may move a rank to: the job's spares, else the plan's (the inventory's)."""
        spares = self.job.spares if self.job.spares is not None else list(self.c.plan.spares)
        return [h for h in spares if h not in self.job.ranks]

    def park_spares(self, label: str, timeout_s: float) -> None:
        """Start the job's command on every spare host as a parked spare, and wait (within `timeout_s`) until
        each says it is parked: PyTorch imported, its model built, waiting on the store for a generation.
        """
        assert self.store is not None
        hosts = self._spare_hosts()
        if not hosts:
            raise StepFailed(f"{label}: recovery: in-job needs a spare host to park a spare on; the job has none")
        programs: dict[str, list] = {}
        for host in hosts:
            name = spare_job_name(host, self.starts)
            env = {
                **self.job.env,
                "RANK": "0",
                "WORLD_SIZE": str(len(self.ranks)),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "TESTBED_CHECKPOINT_DIR": self.job.checkpoint_dir,
                **(self.served.env(host) if self.served is not None else {}),
                **self.store.env(host, spare=True),
            }
            slug = re.sub(r"[^A-Za-z0-9_.-]", "-", str(self.c.recorder.run_id))
            workdir = f"testbed-jobs/{slug}/start{self.starts}/spare-{host}"  # as Launch.workdir names a slot's
            start = {"command": list(self.job.command), "name": name, "gpus": [0], "env": env, "workdir": workdir}
            wait = {"job": name, "progress": PARKED, "min_step": 0, "max_s": timeout_s, "mark": Op.FIRST_STEP}
            programs[host] = [(label, "gpu.start_job", start), (label, "gpu.wait_step", wait)]
        results = self.c.dispatch(programs)
        for host, (started, _) in results.items():
            if started is not None and started.status == "ok":
                self.spares[host] = started.value
        for host, (started, parked) in results.items():
            if parked is None or parked.status != "ok":
                why = (parked.error if parked is not None else None) or (started.error if started else None)
                raise StepFailed(f"{label}: the spare on {host} did not park within {timeout_s:g} s: {why}")

    def abort_generation(self, reason: str) -> int:
        """Mark the current generation broken, at once: its members leave its process group. Its number."""
        if self.store is None:
            raise StepFailed("in-job recovery: the job's store is not open (job.start opens it)")
        return self.store.abort(reason)

    def end_rank(self, label: str, rank: int, hit: frozenset[str] = frozenset()) -> None:
        """Stop rank `rank`'s process, whatever state it is in (a hung one is continued and killed: it never comes
        back into the job); its handle is dropped. A failure on a host in `hit` is the fault's expected outcome.
        """
        handle = self.handles.pop(rank, None)
        if handle is None:
            return
        host = self.ranks[rank].host
        results = self.c.dispatch({host: [(label, "gpu.stop_job", {"job": handle})]})
        if host not in hit:
            raise_failures(results[host])

    def replace_rank(self, label: str, rank: int, failed: str, spare: str, timeout_s: float) -> tuple[int, OpResult]:
        """Publish the next generation, the parked spare on `spare` in slot `failed` (rank `rank`), and follow the
        spare's log to its ready line (the new generation formed) and its first step, within `timeout_s`. Returns
        the generation_published ns and the spare's wait result (job_ready, first_step, the step resumed from).
        """
        if self.store is None or spare not in self.spares:
            raise StepFailed(f"{label}: no spare parked on {spare} to take slot {failed} (rank {rank})")
        handle = self.spares.pop(spare)
        self.handles[rank] = handle  # the spare is the rank now: job.stop stops it as one
        if self.commit is not None and self.job.fabric is not None:
            # the twin's kernel data plane (--netns) routes the ranks' data addresses over the rewired fabric, as a
            # launch has it do: the new generation's members reach the spare only then
            self.commit(fabric_links(self.job.fabric, self.assignment))
        generation = self.store.replace(failed, spare, f"rank {rank} ({failed}) replaced by {spare}")
        data = {"generation": generation.number, "slot": failed, "spare": spare, "rank": rank}
        published = self.c.recorder.emit("mark", Op.GENERATION_PUBLISHED, step=label, data=data).mono_ns
        wait = {"job": handle, "progress": self.job.progress, "ready": READY, "min_step": 0, "max_s": timeout_s}
        (result,) = self.c.dispatch({spare: [(label, "gpu.wait_step", {**wait, "mark": Op.FIRST_STEP})]})[spare]
        if result is None or result.status != "ok":
            why = result.error if result is not None else "not run"
            raise StepFailed(
                f"{label}: generation {generation.number} did not form: rank {rank} on the spare {spare} (in slot "
                f"{failed}) did not reach its first step (bound {timeout_s:g} s): {why}"
            )
        return published, result
