"""Workloads the framework ships: the reference training job (`testbed-train`)."""
