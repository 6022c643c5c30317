"""Two fixed waits in the start of a local Ray instance that are Ray's, not the run's, and how they are cut.

Measured on this project's 2-core control host (Ray 2.60; strace of the raylet, cProfile of ray.init): a bare
`ray.init(address="local")` takes ~2.2 s, and two fixed sleeps are ~1 s of it (docs/architecture.md, "Start-up"):

1. The raylet connects to its own object store right after starting the store's thread; most times the socket is
   not there yet, and it retries after `raylet_client_connect_timeout_milliseconds` (1000 ms by default). A 20 ms
   interval with 50 times the attempts keeps Ray's 10 s budget. Passed as the instance's system config, so only
   an instance this process starts gets it; a cluster is started by the lab, with the lab's settings.
2. The driver then asks the GCS for its node (`ray._private.services.get_node`); the C++ accessor behind it sleeps
   a fixed second whenever the raylet has not registered yet, and the raylet registers only once its Python
   agents are up, ~0.5 s later. `node_registration_polled` waits for the registration itself, reading the
   GCS's node table every 20 ms, and then lets Ray's call run, which answers at once.

Neither changes what Ray does once it is up. Both touch Ray internals (a config key and a private function), so
each is guarded: if Ray no longer has them, its start is only as slow as Ray's own.
"""

from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger(__name__)

# Ray's defaults are 1000 ms x 10 attempts; the same 10 s, polled fifty times as often.
LOCAL_SYSTEM_CONFIG = {"raylet_client_connect_timeout_milliseconds": 20, "raylet_client_num_connect_attempts": 500}
POLL_S = 0.02
REGISTRATION_TIMEOUT_S = 30.0  # Ray's own raylet_start_wait_time_s


@contextlib.contextmanager
def node_registration_polled(ray):
    """While it is open, Ray's start waits for its node's registration by polling the GCS every 20 ms instead
    of sleeping a second at a time. Only for a local start: with an address, Ray starts no node."""
    services = getattr(getattr(ray, "_private", None), "services", None)
    original = getattr(services, "get_node", None)
    if original is None:  # a Ray without it: its own waits stay
        yield
        return

    def get_node(gcs_address, node_id):
        try:
            _wait_until_registered(ray, services, gcs_address, node_id)
        except Exception as exc:  # Ray's internals moved: its own (slower) wait still works
            log.debug("polling the GCS for node %s failed (%s); Ray waits its own way", node_id, exc)
        return original(gcs_address, node_id)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = original


def _wait_until_registered(ray, services, gcs_address: str, node_id: str) -> None:
    state = ray._private.state.GlobalState()
    state._initialize_global_state(services._get_gcs_client_options(gcs_address))
    deadline = time.monotonic() + REGISTRATION_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(node.get("NodeID") == node_id and node.get("Alive") for node in state.node_table()):
            return
        time.sleep(POLL_S)
