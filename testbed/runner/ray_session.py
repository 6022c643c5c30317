"""Starting or joining Ray.

Locally we start a private instance: bounded CPUs and memory, no dashboard, every server bound to
127.0.0.1. Ray resolves "127.0.0.1" to the machine's outward address unless it runs in single-machine
mode, which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 selects; Ray reads it at import, so ray is imported
only here, after the choice is made. With an address we join that cluster as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys

LOCAL_CPUS = 2
LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """Yields the ray module, initialised. Reuses an instance already initialised in this process."""
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        yield ray
        return
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, namespace="testbed")
    try:
        if address is None:
            # address="local": always a new private instance; without it Ray joins any cluster it finds
            # running on this machine (another run's, a test's), which is not ours to use.
            ray.init(
                address="local",
                num_cpus=LOCAL_CPUS,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                **common,
            )
        else:
            ray.init(address=address, **common)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        from testbed.errors import UserError

        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise UserError(
            f"cannot start or join {where}: {exc}\n  try: check the address (ray status on the "
            "head node prints it) or omit --ray-address to run locally"
        ) from None
    try:
        yield ray
    finally:
        # Ray prints to stderr on shutdown in some versions; keep the user's terminal clean.
        sys.stderr.flush()
        ray.shutdown()
