"""Fabric logic, pure: logical topologies over an assignment of ranks to hosts (topology, jobfabric), the
circuits each switch must hold for them, through one switch or several over trunks (circuits), the minimal
change from one set of circuits to another (diff), and which spare replaces a failed host (spares). No I/O
here: the planner, the steps and the procedures call it. (No re-exports: the procedures use `diff` alone and
must not load the inventory's models through this package.)"""
