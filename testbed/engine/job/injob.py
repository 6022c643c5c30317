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
from collections.abc import Mapping

from hostside import membership
from testbed.contracts.errors import StepFailed
from testbed.fabric_service.addresses import service_addresses

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

    def close(self) -> None:
        """Stop serving: the server ends with its last reference (TCPStore has no close of its own)."""
        self._store = None
