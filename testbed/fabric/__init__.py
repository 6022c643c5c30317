"""Fabric logic, pure: logical topologies over an assignment of ranks to hosts (topology, jobfabric), the
circuits each switch must hold for them, through one switch or several over trunks (circuits), and which spare
replaces a failed host (spares). No I/O here: the planner, the steps and the engine call it. It reads an inventory
through testbed.fabric.inventory_view. (The minimal change from one switch's circuits to another's is the
switch families' own: testbed.families.switching.)
"""
