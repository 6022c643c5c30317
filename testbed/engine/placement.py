"""Where a device's actor runs: anywhere, or on the Ray node its inventory entry is pinned to (the control
host its serial cable is plugged into).

`node:` in the inventory names a Ray node by its label `testbed-node` (start Ray on the control host with
`ray start --address=HEAD --labels='{"testbed-node": "ctrl-a"}'`), or by node ID, node name, hostname or
IP address.
"""

from __future__ import annotations

from testbed.contracts.errors import UserError

NODE_LABEL = "testbed-node"


def find_node(ray, node: str) -> list[dict]:
    matches = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        names = {
            n.get("NodeID"),
            n.get("NodeManagerAddress"),
            n.get("NodeManagerHostname"),
            n.get("NodeName"),
            (n.get("Labels") or {}).get(NODE_LABEL),
        }
        if node in names:
            matches.append(n)
    # A label names one node on purpose; addresses and hostnames repeat when nodes share a machine.
    labelled = [n for n in matches if (n.get("Labels") or {}).get(NODE_LABEL) == node]
    return labelled or matches


def actor_options(ray, device: str, node: str | None, *, emulate: bool = False) -> tuple[dict, str | None]:
    """Ray options for the device's actor, and a note when a pin was not applied (emulated runs only)."""
    # num_cpus=0: an actor mostly waits on I/O; many devices must fit on a 2-core control host.
    options: dict = {"num_cpus": 0}
    if node is None:
        return options, None
    matches = find_node(ray, node)
    if len(matches) != 1:
        if emulate:
            return options, f"{device}: pinned to Ray node {node!r}, not in this cluster; emulated here"
        alive = [
            f"{n.get('NodeManagerAddress')} ({(n.get('Labels') or {}).get(NODE_LABEL, 'no label')})"
            for n in ray.nodes()
            if n.get("Alive")
        ]
        what = "is not in the cluster" if not matches else f"matches {len(matches)} nodes"
        raise UserError(
            f"{device} is pinned to Ray node {node!r}, which {what} (nodes: {', '.join(alive)}); "
            f'start Ray on that host with --labels=\'{{"{NODE_LABEL}": "{node}"}}\' or change '
            "`node` in the inventory"
        )
    target = matches[0]
    if emulate and target.get("NodeManagerAddress") != ray.util.get_node_ip_address():
        # The twin's endpoints (loopback ports, ptys) exist only on this machine.
        return options, f"{device}: pinned to {node!r} on another machine; emulated devices run on this one"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(target["NodeID"], soft=False)
    return options, None
