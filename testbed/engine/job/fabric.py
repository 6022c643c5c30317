"""The job's fabric (the playbook's `job.fabric`): the planned `ApplyStep` that makes the switches hold its
topology over an assignment of ranks to hosts, and its execution on every switch at once, retried on a switch
whose connection failed.
"""

from __future__ import annotations

import time

from testbed.config.sections import JobFabric
from testbed.contracts.errors import StepFailed, raise_failures
from testbed.documents.inventory import Inventory
from testbed.fabric.circuits import PathError, links_to_circuits
from testbed.fabric.jobfabric import fabric_links
from testbed.steps.fabric_apply import ApplyStep

# A switch whose connection failed during a rewiring is tried again for this long after the failure (then the
# step fails). Counted from the failure, not from the first attempt: an attempt that ran into the device's own
# timeout (timeout_ms, often 2-5 s on a lab) must still leave time to try again once the connection is back.
FABRIC_RETRY_S = 3.0
FABRIC_RETRY_BACKOFF_S = 0.05
RETRYABLE = {"DeviceConnectionError", "DeviceTimeout"}


def fabric_step(
    fabric: JobFabric,
    hosts: list[str],
    inventory: Inventory,
    managed: dict[str, tuple[int, ...]],
    label: str,
) -> ApplyStep:
    """The ApplyStep that puts the fabric over `hosts` (hosts[rank] runs that rank) on the switches: the
    circuits its links need, removing others only on the ports the job's fabric owns (`managed`).
    """
    if len(set(hosts)) != len(hosts):
        raise StepFailed("a job fabric needs one rank per host (a host transmits on one port per rail)")
    try:
        circuits = links_to_circuits(fabric_links(fabric, hosts), inventory)
    except PathError as exc:
        raise StepFailed(f"job fabric: {exc}") from None
    return ApplyStep(
        label=label,
        configuration="job fabric",
        circuits=circuits,
        managed={sw: managed.get(sw, ()) for sw in circuits},
        measure=None,
        verify_light=fabric.verify_light,
        min_power_dbm=fabric.min_power_dbm,
        timeout_s=fabric.light_timeout_ms / 1000,
    )


def rewire(coordinator, step: ApplyStep, label: str) -> dict:
    """Apply the job fabric on every switch at once; a switch whose connection failed (a reset, a stall,
    a refused connection: the device may be fine) is tried again until FABRIC_RETRY_S after it failed. Its
    procedure reads the switch afresh each time (a failed one forgets its cached state), so a retry
    after a lost acknowledgement sends only what is still missing. Every attempt is in the history.
    Returns each switch's result with its sent / acked / lit marks.
    """
    calls = step.calls(coordinator)
    deadline: float | None = None
    done: dict = {}
    while True:
        results = {d: r[0] for d, r in coordinator.dispatch({d: [(label, *calls[d])] for d in calls}).items()}
        done.update(results)
        failed = {d: r for d, r in results.items() if r is None or r.status != "ok"}
        retry = all(r is not None and r.error_type in RETRYABLE for r in failed.values())
        if failed and deadline is None:
            deadline = time.monotonic() + FABRIC_RETRY_S
        if not failed or not retry or (deadline is not None and time.monotonic() >= deadline):  # set if failed
            raise_failures(done.values())
            return done
        calls = {d: calls[d] for d in failed}
        time.sleep(FABRIC_RETRY_BACKOFF_S)  # give the connection a moment to come back: recovery, not sync
