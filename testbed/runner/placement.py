"""Where a device's actor runs: anywhere, or on the Ray node its inventory entry is pinned to (the
control host its serial cable is plugged into)."""

from __future__ import annotations

from testbed.errors import UserError


def actor_options(ray, device: str, node: str | None) -> dict:
    # num_cpus=0: an actor mostly waits on I/O; many devices must fit on a 2-core control host.
    options: dict = {"num_cpus": 0, "max_concurrency": 1, "name": None}
    options.pop("name")
    if node is None:
        return options
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        names = {n.get("NodeID"), n.get("NodeManagerAddress"), n.get("NodeManagerHostname"), n.get("NodeName")}
        if node in names:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            return options
    alive = [n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")]
    raise UserError(
        f"{device} is pinned to Ray node {node!r}, which is not in the cluster (nodes: "
        f"{', '.join(alive)}); start Ray on that host or change `node` in the inventory"
    )
