"""A seeded, Toxiproxy-compatible TCP fault proxy for the twin.

    proxy = FaultProxy("ocs1", ("127.0.0.1", 5025), seed=1)
    address = await proxy.start()            # "127.0.0.1:PORT": point the driver here
    proxy.add_toxic("slow", "latency", "downstream", latency=50, jitter=5)
    proxy.set_enabled(False)                 # down: refuse new connections, cut open ones

ProxyServer serves Toxiproxy's HTTP API over a set of FaultProxy objects, so Toxiproxy client code
drives it unchanged (and real Toxiproxy can replace it in a lab's CI). Toxic semantics are in
emulators/proxy/toxics.py, connection handling and determinism in emulators/proxy/core.py.
"""

from emulators.proxy.core import FaultProxy
from emulators.proxy.http import ProxyServer
from emulators.proxy.toxics import SCHEMA, STREAMS, ConflictError, NotFoundError

TOXIC_TYPES = tuple(SCHEMA)

__all__ = ["FaultProxy", "ProxyServer", "ConflictError", "NotFoundError", "STREAMS", "TOXIC_TYPES"]
