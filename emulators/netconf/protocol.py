"""The names this NETCONF server speaks (RFC 6241's namespaces and base capabilities, the YANG modules it
serves) and its one way of refusing: RpcError, an <rpc-error> with an RFC 6241 Appendix A error-tag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"
MOTION_NS = "urn:testbed:yang:switch-motion"  # the project's own module [P]
XML_NS = "http://www.w3.org/XML/1998/namespace"
BASE_10 = "urn:ietf:params:netconf:base:1.0"
BASE_11 = "urn:ietf:params:netconf:base:1.1"
# The error-type each tag is sent with unless a handler says otherwise (RFC 6241 Appendix A).
ERROR_TYPE = {
    "malformed-message": "rpc", "too-big": "rpc", "missing-attribute": "rpc", "bad-attribute": "protocol",
    "unknown-attribute": "protocol", "missing-element": "protocol", "bad-element": "protocol",
    "unknown-element": "protocol", "unknown-namespace": "protocol", "operation-not-supported": "protocol",
    "lock-denied": "protocol", "in-use": "protocol", "invalid-value": "application",
    "data-missing": "application", "data-exists": "application", "operation-failed": "application",
}  # fmt: skip

T = TypeVar("T")
Run = Callable[[Callable[[], T]], T]  # runs model access on the model's thread (NetconfFrontend: the twin's loop)


def run_here(fn: Callable[[], T]) -> T:
    """A Run that calls `fn` on the caller's thread (no event loop: tests, the replay)."""
    return fn()


class RpcError(Exception):
    """An <rpc-error> to answer with (RFC 6241 §4.3)."""

    def __init__(
        self, tag: str, message: str, *, type: str | None = None, info: dict | None = None, path: str | None = None
    ) -> None:
        super().__init__(message)
        self.tag = tag
        self.type = type or ERROR_TYPE.get(tag, "application")
        self.message = message
        self.info = info or {}
        self.path = path
