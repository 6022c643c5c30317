"""The fabric service as a run serves it while its job runs (job.fabric_service, docs/fabric_service.md).

Started by job.start before the ranks (its address and token go into their environment), closed when the job
stops. A rank's `setup` applies the planned configuration exactly as fabric.apply does (`ApplyStep.execute`
through the coordinator: each switch's family `reconfigure`, light verified, every call in the history). One
configuration is applied at a time; a request for the configuration the service last put in place is answered
at once (at a phase boundary every rank asks for the same one: the first applies it, the others wait for it
and are answered without a second change). `prepare` and `release` are answered ok and recorded, and change
nothing yet.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from testbed.fabric_service.protocol import ConfigRequest, Setup
from testbed.fabric_service.server import FabricService


class ServedFabric:
    def __init__(self, coordinator, steps: dict) -> None:
        self.c = coordinator
        self.steps = steps  # configuration -> its planned ApplyStep (Plan.fabric_service)
        self.current: str | None = None  # the configuration this service last put in place
        self._lock = threading.Lock()
        self.service = FabricService(secrets.token_hex(16), set(steps), self._handle, self._record)

    def env(self) -> dict[str, str]:
        return self.service.env()

    def close(self) -> None:
        self.service.close()

    def _handle(self, request: ConfigRequest) -> None:
        if not isinstance(request, Setup):
            return  # prepare / release: recorded by the service, no fabric change yet
        with self._lock:  # concurrent requests wait for the change under way, then find it in place
            if self.current == request.config:
                return
            self.current = None  # a change that fails leaves the fabric unknown
            self.steps[request.config].execute(self.c)
            self.current = request.config

    def _record(self, event: dict[str, Any]) -> None:
        data = dict(event)
        op = data.pop("event")
        self.c.recorder.emit("mark", op, data=data)
