"""NETCONF on the switch model: one message of XML in, one reply of XML out, no I/O (RFC 6241).

What is served (docs/protocols.md §7 has the sources):
- <hello> with base:1.0 and base:1.1, :writable-running, :rollback-on-error, the Polatis `optical-switch`
  module with its revision (an option: before 2017-08-04 the cross-connect list is `pairs`, from then on
  `pair`, as ONOS's Polatis driver reads it) and the project's switch-motion module (how long until the mirrors
  have settled: NETCONF has no *OPC?).
- get / get-config on `running` with subtree filters (RFC 6241 §6) over: cross-connects, port-config (port-id,
  status), opm-power (port-id, power), product-information, switch-motion.
- edit-config on `running`: merge / replace / create / delete / remove of cross-connect pairs, default-operation
  merge / replace / none. An edit is all or nothing (hence :rollback-on-error, whatever error-option says).
- the optical-switch RPC port-set-state (port-enab / port-disab leaf-lists), lock / unlock of `running`,
  close-session. Anything else: operation-not-supported.

Every reply that refuses something is an <rpc-error> with an RFC 6241 Appendix A error-tag. XML is parsed with
defusedxml: a DTD, an entity declaration or an external reference is refused as malformed-message (which a
base:1.0 session gets as operation-failed: malformed-message is new in base:1.1 and must not go to 1.0 peers).

The session routes each operation: reads to emulators/netconf/reads.py, writes of `running` to writes.py; the XML
helpers and subtree filtering are xmltree.py's, operation parameters params.py's, the names and RpcError
protocol.py's.

Model access goes through `run(fn)`, which the front end points at the twin's event loop (the engine is not
thread-safe); parsing, filtering and serialising happen on the caller's thread.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulators.netconf.params import check_running, op_params
from emulators.netconf.protocol import BASE_10, BASE_11, NC_NS, OPSW_NS, RpcError, Run, run_here
from emulators.netconf.reads import DataReads
from emulators.netconf.switch import NetconfOptions
from emulators.netconf.writes import RunningWrites
from emulators.netconf.xmltree import escape, parse_xml, split, text_of


class SessionEnd(Exception):
    """The session must close without a reply (a bad hello, RFC 6241 §8.1)."""


@dataclass
class Reply:
    xml: bytes | None  # None: nothing to send
    close: bool = False  # close the session once it is sent


class NetconfServer:  # a Switch (emulators/netconf/switch.py): what DataReads and RunningWrites use of it
    """One per switch: the model, the options, session ids and the lock of `running` (shared by sessions)."""

    def __init__(self, engine: Any, options: NetconfOptions | None = None, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.options = options or NetconfOptions()
        self.clock = clock
        self.lock_owner: int | None = None
        self._next_id = 1

    def new_session(self) -> ServerSession:
        sid, self._next_id = self._next_id, self._next_id + 1
        return ServerSession(self, sid)


class ServerSession:
    """One client's NETCONF session: the hello, each <rpc> to its <rpc-reply>, the lock of `running` it holds.

    Reads and writes of the datastore are DataReads' and RunningWrites'; the session routes each operation to them.
    """

    def __init__(self, server: NetconfServer, session_id: int) -> None:
        self.server = server
        self.id = session_id
        self.base11: bool | None = None  # None until the client's hello arrived
        self.reads = DataReads(server)
        self.writes = RunningWrites(server, session_id)

    # -- hello --------------------------------------------------------------------------------------

    def hello(self) -> bytes:
        caps = "".join(f"<capability>{escape(c)}</capability>" for c in self.server.options.capabilities)
        return (
            f'<?xml version="1.0" encoding="UTF-8"?><hello xmlns="{NC_NS}"><capabilities>{caps}</capabilities>'
            f"<session-id>{self.id}</session-id></hello>"
        ).encode()

    def handle_hello(self, message: bytes) -> bool:
        """The client's hello; returns whether the session goes on in chunked framing (base:1.1 on both sides).
        Raises SessionEnd for a hello the session cannot go on from.
        """
        try:
            root = parse_xml(message)
        except RpcError as exc:
            raise SessionEnd(f"unreadable hello: {exc.message}") from None
        if root.tag != f"{{{NC_NS}}}hello":
            raise SessionEnd(f"expected <hello> first, got <{split(root.tag)[1]}>")
        if root.find(f"{{{NC_NS}}}session-id") is not None:
            raise SessionEnd("a client's hello must not carry a session-id (RFC 6241 §8.1)")
        caps = {text_of(c) for c in root.iterfind(f"{{{NC_NS}}}capabilities/{{{NC_NS}}}capability")}
        if not caps & {BASE_10, BASE_11}:
            raise SessionEnd("the client advertises neither base:1.0 nor base:1.1")
        self.base11 = self.server.options.base11 and BASE_11 in caps
        return self.base11

    # -- rpc ----------------------------------------------------------------------------------------

    def handle(self, message: bytes, run: Run = run_here) -> Reply:
        """One <rpc> -> its <rpc-reply>; never raises for what the client sent."""
        attrs: dict[str, str] = {}
        try:
            root = parse_xml(message)
            if root.tag != f"{{{NC_NS}}}rpc":
                raise RpcError("malformed-message", f"expected <rpc> in {NC_NS}, got <{split(root.tag)[1]}>")
            attrs = {k: v for k, v in root.attrib.items() if not k.startswith("{")}
            if "message-id" not in attrs:
                raise RpcError(
                    "missing-attribute",
                    "<rpc> needs a message-id attribute",
                    info={"bad-attribute": "message-id", "bad-element": "rpc"},
                )
            ops = list(root)
            if len(ops) != 1:
                what = "no operation" if not ops else f"{len(ops)} operations"
                raise RpcError(
                    "missing-element" if not ops else "bad-element",
                    f"<rpc> holds {what}, not one",
                    info={"bad-element": "rpc"},
                )
            body, close = self._dispatch(ops[0], run)
        except RpcError as exc:
            return Reply(self._reply(attrs, self._error(exc)))
        return Reply(self._reply(attrs, body), close)

    def error_reply(self, tag: str, message: str) -> bytes:
        """A reply for a message that could not be framed (the front end closes the session after it)."""
        return self._reply({}, self._error(RpcError(tag, message)))

    def end(self) -> None:
        """The session is over: its lock goes with it (RFC 6241 §7.5). Call through `run`."""
        if self.server.lock_owner == self.id:
            self.server.lock_owner = None

    def _reply(self, attrs: dict[str, str], body: str) -> bytes:
        extra = "".join(f' {k}="{escape(v, True)}"' for k, v in attrs.items())
        return f'<?xml version="1.0" encoding="UTF-8"?><rpc-reply xmlns="{NC_NS}"{extra}>{body}</rpc-reply>'.encode()

    def _error(self, exc: RpcError) -> str:
        tag, etype = exc.tag, exc.type
        if tag == "malformed-message" and not self.base11:
            tag = "operation-failed"  # RFC 6241 Appendix A: malformed-message must not be sent to base:1.0 peers
        parts = [f"<error-type>{etype}</error-type><error-tag>{tag}</error-tag><error-severity>error</error-severity>"]
        if exc.path:
            parts.append(f'<error-path xmlns:opsw="{OPSW_NS}">{escape(exc.path)}</error-path>')
        parts.append(f'<error-message xml:lang="en">{escape(exc.message)}</error-message>')
        if exc.info:
            parts.append("<error-info>" + "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in exc.info.items()))
            parts.append("</error-info>")
        return "<rpc-error>" + "".join(parts) + "</rpc-error>"

    def _dispatch(self, op: ET.Element, run: Run) -> tuple[str, bool]:
        ns, name = split(op.tag)
        if ns == NC_NS:
            if name == "get":
                return self.reads.get(op, run, config_only=False), False
            if name == "get-config":
                return self.reads.get(op, run, config_only=True), False
            if name == "edit-config":
                return self.writes.edit_config(op, run), False
            if name == "lock":
                return self._lock(op, run), False
            if name == "unlock":
                return self._unlock(op, run), False
            if name == "close-session":
                run(self.end)  # before the reply: a client that saw <ok/> may count on the lock being free
                return "<ok/>", True
            raise RpcError(
                "operation-not-supported", f"<{name}> is not supported by this switch", info={"bad-element": name}
            )
        if ns == OPSW_NS:
            if name == "port-set-state":
                return self.writes.port_set_state(op, run), False
            raise RpcError(
                "operation-not-supported",
                f"the optical-switch RPC <{name}> is not supported",
                info={"bad-element": name},
            )
        raise RpcError(
            "unknown-namespace",
            f"no RPC <{name}> in namespace {ns!r}",
            info={"bad-element": name, "bad-namespace": ns or ""},
        )

    # -- lock, unlock -------------------------------------------------------------------------------

    def _lock(self, op: ET.Element, run: Run) -> str:
        check_running(op_params(op, ("target",)), "target")

        def take() -> None:
            owner = self.server.lock_owner
            if owner is not None:
                who = "this session" if owner == self.id else f"session {owner}"
                raise RpcError("lock-denied", f"running is locked by {who}", info={"session-id": owner})
            self.server.lock_owner = self.id

        run(take)
        return "<ok/>"

    def _unlock(self, op: ET.Element, run: Run) -> str:
        check_running(op_params(op, ("target",)), "target")

        def release() -> None:
            if self.server.lock_owner != self.id:
                held = self.server.lock_owner
                why = "is not locked" if held is None else f"is locked by session {held}"
                raise RpcError("operation-failed", f"running {why}, not by this session")
            self.server.lock_owner = None

        run(release)
        return "<ok/>"
