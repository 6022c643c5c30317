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

Model access goes through `run(fn)`, which the front end points at the twin's event loop (the engine is not
thread-safe); parsing, filtering and serialising happen on the caller's thread.
"""

from __future__ import annotations

import copy
import math
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from emulators.scpi.ocs import SwitchRefused

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"
MOTION_NS = "urn:testbed:yang:switch-motion"  # the project's own module [P]
XML_NS = "http://www.w3.org/XML/1998/namespace"
BASE_10 = "urn:ietf:params:netconf:base:1.0"
BASE_11 = "urn:ietf:params:netconf:base:1.1"
PAIR_REVISION = "2017-08-04"  # from this revision on the list is `pair`, before it `pairs` (ONOS PolatisUtility)
MOTION_REVISION = "2025-01-01"
OPERATIONS = ("merge", "replace", "create", "delete", "remove")
# optical-switch containers this server knows but does not let edit-config change.
_OPSW_OTHER = {
    "product-information", "port-config", "opm-power", "opm-config", "opm-alarm-config", "voa", "ports",
    "system-config", "aps", "subswitches", "groups",
}  # fmt: skip
_UINT = re.compile(r"[0-9]{1,10}")
_XML_DECL = re.compile(rb"\A<\?xml[^>]*?encoding\s*=\s*['\"]([A-Za-z0-9._-]+)['\"]")
# The error-type each tag is sent with unless a handler says otherwise (RFC 6241 Appendix A).
_ERROR_TYPE = {
    "malformed-message": "rpc", "too-big": "rpc", "missing-attribute": "rpc", "bad-attribute": "protocol",
    "unknown-attribute": "protocol", "missing-element": "protocol", "bad-element": "protocol",
    "unknown-element": "protocol", "unknown-namespace": "protocol", "operation-not-supported": "protocol",
    "lock-denied": "protocol", "in-use": "protocol", "invalid-value": "application",
    "data-missing": "application", "data-exists": "application", "operation-failed": "application",
}  # fmt: skip

T = TypeVar("T")
Run = Callable[[Callable[[], T]], T]


def _direct(fn: Callable[[], T]) -> T:
    return fn()


@dataclass(frozen=True)
class NetconfOptions:
    """Front-end options where the sources are silent or switches differ."""

    revision: str = "2018-03-22"  # the optical-switch module revision in the hello (ONOS's generated model)
    base11: bool = True  # advertise base:1.1 (chunked framing); False: a base:1.0-only server
    accept_unqualified_operation: bool = True  # ONOS sends operation="delete" without the NETCONF namespace
    motion: bool = True  # serve and advertise the switch-motion module (wait_settled without it: a fixed wait)
    max_message: int = 4 * 1024 * 1024  # bytes of one incoming message
    message_timeout_s: float = 30.0  # a message begun must end within this
    hello_timeout_s: float = 30.0  # the client's hello must arrive within this
    transcript: bool = False  # keep each session's (rpc, reply) messages in its record (tests read them)

    @property
    def list_name(self) -> str:
        return "pairs" if self.revision < PAIR_REVISION else "pair"

    @property
    def capabilities(self) -> list[str]:
        caps = [BASE_10] + ([BASE_11] if self.base11 else [])
        caps += [
            "urn:ietf:params:netconf:capability:writable-running:1.0",
            "urn:ietf:params:netconf:capability:rollback-on-error:1.0",
            f"{OPSW_NS}?module=optical-switch&revision={self.revision}",
        ]
        if self.motion:
            caps.append(f"{MOTION_NS}?module=testbed-switch-motion&revision={MOTION_REVISION}")
        return caps


class RpcError(Exception):
    """An <rpc-error> to answer with (RFC 6241 §4.3)."""

    def __init__(
        self, tag: str, message: str, *, type: str | None = None, info: dict | None = None, path: str | None = None
    ) -> None:
        super().__init__(message)
        self.tag = tag
        self.type = type or _ERROR_TYPE.get(tag, "application")
        self.message = message
        self.info = info or {}
        self.path = path


class SessionEnd(Exception):
    """The session must close without a reply (a bad hello, RFC 6241 §8.1)."""


@dataclass
class Reply:
    xml: bytes | None  # None: nothing to send
    close: bool = False  # close the session once it is sent


# -- XML helpers ------------------------------------------------------------------------------------


def split(tag: str) -> tuple[str | None, str]:
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return None, tag


def parse_xml(message: bytes) -> ET.Element:
    """UTF-8 XML without DTD or entities; anything else is malformed-message (RFC 6241 Appendix A)."""
    try:
        message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RpcError("malformed-message", f"the message is not UTF-8: {exc}") from None
    decl = _XML_DECL.match(message)
    if decl and decl.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
        raise RpcError("malformed-message", f"encoding {decl.group(1).decode()} is not UTF-8")
    try:
        return SafeET.fromstring(message, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise RpcError("malformed-message", f"DTDs and entities are refused: {type(exc).__name__}") from None
    except ET.ParseError as exc:
        raise RpcError("malformed-message", f"not well-formed XML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # expat oddities: the message is unusable either way
        raise RpcError("malformed-message", f"unreadable XML: {type(exc).__name__}") from None


def _esc(text: str, attr: bool = False) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if attr:
        text = text.replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    return text.replace("\r", "&#13;")


def to_xml(elem: ET.Element, parent_ns: str | None = None) -> str:
    """Serialise with a default namespace per element (xmlns="..." where it changes), as Polatis and ONOS write
    it, not ElementTree's ns0: prefixes. Only unqualified attributes and xml:lang are kept.
    """
    ns, local = split(elem.tag)
    parts = [f"<{local}"]
    if ns != parent_ns:
        parts.append(f' xmlns="{_esc(ns or "", True)}"')
    for key, value in elem.attrib.items():
        kns, kname = split(key)
        if kns is None:
            parts.append(f' {kname}="{_esc(value, True)}"')
        elif kns == XML_NS:
            parts.append(f' xml:{kname}="{_esc(value, True)}"')
    children = list(elem)
    if not children and not elem.text:
        parts.append("/>")
        return "".join(parts)
    parts.append(">")
    if elem.text:
        parts.append(_esc(elem.text))
    for child in children:
        parts.append(to_xml(child, ns))
        if child.tail:
            parts.append(_esc(child.tail))
    parts.append(f"</{local}>")
    return "".join(parts)


def _leaf(parent: ET.Element, ns: str, name: str, text: object) -> ET.Element:
    el = ET.SubElement(parent, f"{{{ns}}}{name}")
    el.text = str(text)
    return el


def _text(elem: ET.Element) -> str:
    return (elem.text or "").strip()


# -- subtree filtering (RFC 6241 §6) ----------------------------------------------------------------


def _name_match(f: ET.Element, d: ET.Element) -> bool:
    fns, flocal = split(f.tag)
    dns, dlocal = split(d.tag)
    # A filter node without a namespace matches any; so does one in the NETCONF namespace, which is where a
    # client's un-namespaced filter lands when it is pasted into the default-namespaced <rpc>.
    return flocal == dlocal and (fns in (None, NC_NS) or fns == dns)


def _is_content(f: ET.Element) -> bool:
    return len(f) == 0 and bool(_text(f))


def select(data: ET.Element, fnodes: list[ET.Element]) -> list[ET.Element] | None:
    """The children of `data` that the sibling filter nodes `fnodes` select; None if a content match fails
    (then `data` itself is not selected).
    """
    content = [f for f in fnodes if _is_content(f)]
    for f in content:
        if not any(_name_match(f, d) and _text(d) == _text(f) for d in data):
            return None
    if len(content) == len(fnodes):  # content matches only: the whole instance
        return [copy.deepcopy(d) for d in data]
    out: list[ET.Element] = []
    for d in data:
        matching = [f for f in fnodes if _name_match(f, d)]
        if not matching:
            continue
        if any((len(f) == 0 and not _text(f)) or (_is_content(f) and _text(f) == _text(d)) for f in matching):
            out.append(copy.deepcopy(d))  # a selection node, or a content match node that matched
            continue
        kids: list[ET.Element] = []
        seen: set[tuple[str, str]] = set()
        for f in matching:
            if len(f):
                for k in select(d, list(f)) or []:
                    key = (k.tag, _text(k)) if len(k) == 0 else (k.tag, str(id(k)))
                    if key not in seen:
                        seen.add(key)
                        kids.append(k)
        if kids:
            shell = ET.Element(d.tag, d.attrib)
            shell.extend(kids)
            out.append(shell)
    return out


def _wanted_ports(fnodes: list[ET.Element]) -> set[int] | None:
    """Ports a filter on a port list names by port-id content match, or None (all ports): a 512-port switch
    should not read 512 power monitors for a query about two.
    """
    wanted: set[int] = set()
    for top in fnodes:
        entries = list(top)
        if not entries:
            return None
        for entry in entries:
            ids = [c for c in entry if split(c.tag)[1] == "port-id" and _UINT.fullmatch(_text(c))]
            if split(entry.tag)[1] != "port" or not ids:
                return None
            wanted.update(int(_text(c)) for c in ids)
    return wanted


# -- the server and its sessions --------------------------------------------------------------------


@dataclass
class _Pair:
    op: str
    ingress: int
    egress: int | None
    path: str


@dataclass
class _Container:
    op: str
    pairs: list[_Pair] = field(default_factory=list)


class NetconfServer:
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
    def __init__(self, server: NetconfServer, session_id: int) -> None:
        self.server = server
        self.id = session_id
        self.base11: bool | None = None  # None until the client's hello arrived

    @property
    def size(self) -> int:
        return self.server.engine.size

    # -- hello --------------------------------------------------------------------------------------

    def hello(self) -> bytes:
        caps = "".join(f"<capability>{_esc(c)}</capability>" for c in self.server.options.capabilities)
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
        caps = {_text(c) for c in root.iterfind(f"{{{NC_NS}}}capabilities/{{{NC_NS}}}capability")}
        if not caps & {BASE_10, BASE_11}:
            raise SessionEnd("the client advertises neither base:1.0 nor base:1.1")
        self.base11 = self.server.options.base11 and BASE_11 in caps
        return self.base11

    # -- rpc ----------------------------------------------------------------------------------------

    def handle(self, message: bytes, run: Run = _direct) -> Reply:
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
        extra = "".join(f' {k}="{_esc(v, True)}"' for k, v in attrs.items())
        return f'<?xml version="1.0" encoding="UTF-8"?><rpc-reply xmlns="{NC_NS}"{extra}>{body}</rpc-reply>'.encode()

    def _error(self, exc: RpcError) -> str:
        tag, etype = exc.tag, exc.type
        if tag == "malformed-message" and not self.base11:
            tag = "operation-failed"  # RFC 6241 Appendix A: malformed-message must not be sent to base:1.0 peers
        parts = [f"<error-type>{etype}</error-type><error-tag>{tag}</error-tag><error-severity>error</error-severity>"]
        if exc.path:
            parts.append(f'<error-path xmlns:opsw="{OPSW_NS}">{_esc(exc.path)}</error-path>')
        parts.append(f'<error-message xml:lang="en">{_esc(exc.message)}</error-message>')
        if exc.info:
            parts.append("<error-info>" + "".join(f"<{k}>{_esc(str(v))}</{k}>" for k, v in exc.info.items()))
            parts.append("</error-info>")
        return "<rpc-error>" + "".join(parts) + "</rpc-error>"

    def _dispatch(self, op: ET.Element, run: Run) -> tuple[str, bool]:
        ns, name = split(op.tag)
        if ns == NC_NS:
            if name == "get":
                return self._get(op, run, config_only=False), False
            if name == "get-config":
                return self._get(op, run, config_only=True), False
            if name == "edit-config":
                return self._edit_config(op, run), False
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
                return self._port_set_state(op, run), False
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

    # -- parameters ---------------------------------------------------------------------------------

    def _params(self, op: ET.Element, allowed: Iterable[str], unqualified: Iterable[str] = ()) -> dict[str, ET.Element]:
        """The operation's parameters by name: each in the NETCONF namespace, known, and at most once.

        `unqualified` names the parameters also taken without a namespace: the ones ncclient passes on as the user
        wrote them (edit-config's <config>, get's and get-config's <filter>; ncclient's validated_element accepts
        both spellings, its examples and most scripts write a bare <config>, and servers take it). Every other
        parameter, and one in any other namespace, stays unknown-namespace as RFC 6241 §3.1 has it.
        """
        found: dict[str, ET.Element] = {}
        allowed = set(allowed)
        for child in op:
            ns, name = split(child.tag)
            if ns is None and name in unqualified:
                ns = NC_NS
            if ns != NC_NS:
                raise RpcError(
                    "unknown-namespace",
                    f"<{name}> in {ns!r} is no parameter of <{split(op.tag)[1]}>",
                    info={"bad-element": name, "bad-namespace": ns or ""},
                )
            if name not in allowed:
                raise RpcError(
                    "unknown-element", f"<{split(op.tag)[1]}> has no parameter <{name}>", info={"bad-element": name}
                )
            if name in found:
                raise RpcError("bad-element", f"<{name}> given twice", info={"bad-element": name})
            found[name] = child
        return found

    def _datastore(self, params: dict[str, ET.Element], which: str) -> None:
        holder = params.get(which)
        if holder is None:
            raise RpcError("missing-element", f"<{which}> is required", info={"bad-element": which})
        stores = list(holder)
        if len(stores) != 1 or stores[0].tag != f"{{{NC_NS}}}running":
            names = ", ".join(split(s.tag)[1] for s in stores) or "nothing"
            raise RpcError(
                "invalid-value",
                f"<{which}> must name <running> (this switch has no other datastore), got {names}",
                type="protocol",
                info={"bad-element": which},
            )

    # -- get / get-config -----------------------------------------------------------------------------

    def _get(self, op: ET.Element, run: Run, *, config_only: bool) -> str:
        params = self._params(op, ("source", "filter") if config_only else ("filter",), unqualified=("filter",))
        if config_only:
            self._datastore(params, "source")
        filt = params.get("filter")
        fnodes: list[ET.Element] | None = None
        if filt is not None:
            kind = filt.get("type", "subtree")
            if kind != "subtree":
                raise RpcError(
                    "operation-not-supported",
                    f"filter type {kind!r}: only subtree filters (no :xpath)",
                    info={"bad-attribute": "type", "bad-element": "filter"},
                )
            fnodes = list(filt)
        wanted: dict[tuple[str, str], set[int] | None] = {}
        for key in self._tops(config_only):
            picked = [f for f in fnodes if _name_match(f, ET.Element(f"{{{key[0]}}}{key[1]}"))] if fnodes else None
            if fnodes is None:
                wanted[key] = None
            elif picked:
                wanted[key] = _wanted_ports(picked)
        data = run(lambda: self._build(wanted, config_only))
        chosen = list(data) if fnodes is None else (select(data, fnodes) or [])
        return "<data>" + "".join(to_xml(c, NC_NS) for c in chosen) + "</data>"

    def _tops(self, config_only: bool) -> list[tuple[str, str]]:
        tops = [(OPSW_NS, "cross-connects"), (OPSW_NS, "port-config")]
        if not config_only:
            tops += [(OPSW_NS, "product-information"), (OPSW_NS, "opm-power")]
            if self.server.options.motion:
                tops.append((MOTION_NS, "switch-motion"))
        return tops

    def _build(self, wanted: dict[tuple[str, str], set[int] | None], config_only: bool) -> ET.Element:
        """The data tree of the containers asked for (runs on the model's thread)."""
        engine, now = self.server.engine, self.server.clock()
        data = ET.Element(f"{{{NC_NS}}}data")
        n = engine.size
        for (ns, name), ports in wanted.items():
            top = ET.SubElement(data, f"{{{ns}}}{name}")
            chosen = range(1, 2 * n + 1) if ports is None else sorted(p for p in ports if 1 <= p <= 2 * n)
            if name == "cross-connects":
                for i, e in sorted(engine.circuits().items()):
                    pair = ET.SubElement(top, f"{{{OPSW_NS}}}{self.server.options.list_name}")
                    _leaf(pair, OPSW_NS, "ingress", i)
                    _leaf(pair, OPSW_NS, "egress", e)
            elif name == "port-config":
                for p in chosen:
                    port = ET.SubElement(top, f"{{{OPSW_NS}}}port")
                    _leaf(port, OPSW_NS, "port-id", p)
                    if not config_only:  # status is config false
                        _leaf(port, OPSW_NS, "status", _STATUS[engine.port_state(p)])
            elif name == "opm-power":
                for p in chosen:
                    port = ET.SubElement(top, f"{{{OPSW_NS}}}port")
                    _leaf(port, OPSW_NS, "port-id", p)
                    _leaf(port, OPSW_NS, "power", f"{engine.power_dbm(p, now):.2f}")
            elif name == "product-information":
                for leaf, value in zip(
                    ("manufacturer", "model-name", "serial-number", "software-version"), _product(engine), strict=True
                ):
                    _leaf(top, OPSW_NS, leaf, value)
            elif name == "switch-motion":
                remaining = max(0.0, engine.operations_complete_at(now) - now)
                _leaf(top, MOTION_NS, "settle-remaining-us", math.ceil(remaining * 1e6))
                for p in range(1, 2 * n + 1):
                    if engine.is_moving(p, now):
                        _leaf(top, MOTION_NS, "moving-port", p)
        return data

    # -- edit-config ----------------------------------------------------------------------------------

    def _edit_config(self, op: ET.Element, run: Run) -> str:
        params = self._params(
            op, ("target", "default-operation", "test-option", "error-option", "config", "url"), unqualified=("config",)
        )
        self._datastore(params, "target")
        default_op = self._choice(params, "default-operation", ("merge", "replace", "none"), "merge")
        self._choice(params, "test-option", ("set", "test-then-set"), "set")  # without :validate both just set
        self._choice(params, "error-option", ("stop-on-error", "continue-on-error", "rollback-on-error"), "")
        if "url" in params:
            raise RpcError(
                "operation-not-supported",
                "<url> needs :url, which this switch does not have",
                info={"bad-element": "url"},
            )
        config = params.get("config")
        if config is None:
            raise RpcError("missing-element", "<edit-config> needs <config>", info={"bad-element": "config"})
        containers = [self._container(top, default_op) for top in config]
        run(lambda: self._apply_edit(default_op, containers))
        return "<ok/>"

    def _choice(self, params: dict[str, ET.Element], name: str, allowed: tuple[str, ...], default: str) -> str:
        if name not in params:
            return default
        value = _text(params[name])
        if value not in allowed:
            raise RpcError(
                "invalid-value",
                f"<{name}> must be one of {', '.join(allowed)}, got {value!r}",
                type="protocol",
                info={"bad-element": name},
            )
        return value

    def _operation(self, elem: ET.Element, inherited: str) -> str:
        value = elem.get(f"{{{NC_NS}}}operation")
        if value is None and self.server.options.accept_unqualified_operation:
            value = elem.get("operation")
        if value is None:
            return inherited
        if value not in OPERATIONS:
            raise RpcError(
                "bad-attribute",
                f"operation={value!r} is not one of {', '.join(OPERATIONS)}",
                info={"bad-attribute": "operation", "bad-element": split(elem.tag)[1]},
            )
        return value

    def _container(self, top: ET.Element, default_op: str) -> _Container:
        ns, name = split(top.tag)
        if ns == OPSW_NS and name != "cross-connects":
            if name in _OPSW_OTHER:
                raise RpcError(
                    "operation-not-supported",
                    f"edit-config of <{name}> is not supported: only cross-connects",
                    info={"bad-element": name},
                )
            raise RpcError("unknown-element", f"optical-switch has no <{name}>", info={"bad-element": name})
        if ns != OPSW_NS:
            if ns == MOTION_NS:
                raise RpcError("operation-not-supported", f"<{name}> is state data", info={"bad-element": name})
            raise RpcError(
                "unknown-namespace",
                f"<{name}> in {ns!r}: this switch configures {OPSW_NS} only",
                info={"bad-element": name, "bad-namespace": ns or ""},
            )
        cop = self._operation(top, default_op)
        container = _Container(cop)
        child_op = {"create": "merge"}.get(cop, cop)
        list_name = self.server.options.list_name
        for entry in top:
            ens, ename = split(entry.tag)
            if ens != OPSW_NS or ename != list_name:
                hint = ""
                if ename in ("pair", "pairs"):
                    hint = f" (optical-switch revision {self.server.options.revision} names the list {list_name!r})"
                raise RpcError(
                    "unknown-element", f"<cross-connects> has no <{ename}>{hint}", info={"bad-element": ename}
                )
            container.pairs.append(self._pair(entry, child_op))
        return container

    def _pair(self, entry: ET.Element, inherited: str) -> _Pair:
        op = self._operation(entry, inherited)
        leaves: dict[str, str] = {}
        for leaf in entry:
            ns, name = split(leaf.tag)
            if ns != OPSW_NS or name not in ("ingress", "egress"):
                raise RpcError("unknown-element", f"a cross-connect pair has no <{name}>", info={"bad-element": name})
            if name in leaves:
                raise RpcError("bad-element", f"<{name}> given twice in one pair", info={"bad-element": name})
            if leaf.get(f"{{{NC_NS}}}operation") is not None or (
                self.server.options.accept_unqualified_operation and leaf.get("operation") is not None
            ):
                raise RpcError(
                    "bad-attribute",
                    "operations on the ingress/egress leaves are not supported: put it on the pair",
                    info={"bad-attribute": "operation", "bad-element": name},
                )
            leaves[name] = "" if len(leaf) else _text(leaf)
        if "ingress" not in leaves:
            raise RpcError(
                "missing-element", "a cross-connect pair needs its key <ingress>", info={"bad-element": "ingress"}
            )
        n = self.size
        ingress = self._port(leaves["ingress"], 1, n, "ingress")
        path = f"/opsw:cross-connects/opsw:{self.server.options.list_name}[opsw:ingress='{ingress}']"
        egress = None
        if "egress" in leaves:
            egress = self._port(leaves["egress"], n + 1, 2 * n, "egress", path)
        elif op in ("merge", "replace", "create"):
            raise RpcError(
                "missing-element",
                f"pair {ingress}: <egress> is mandatory to {op} it",
                info={"bad-element": "egress"},
                path=path,
            )
        return _Pair(op, ingress, egress, path)

    def _port(self, text: str, lo: int, hi: int, what: str, path: str | None = None) -> int:
        if not _UINT.fullmatch(text) or not lo <= int(text) <= hi:
            raise RpcError(
                "invalid-value",
                f"{what} {text!r} is not a port in {lo}..{hi} of this {self.size}x{self.size} switch",
                info={"bad-element": what},
                path=path,
            )
        return int(text)

    def _apply_edit(self, default_op: str, containers: list[_Container]) -> None:
        """Runs on the model's thread: every change computed first, then applied at once, or nothing."""
        self._check_lock()
        engine = self.server.engine
        current = engine.circuits()
        state = {} if default_op == "replace" else dict(current)
        for c in containers:
            if c.op in ("delete", "remove"):
                if c.op == "delete" and not state:
                    raise RpcError("data-missing", "delete of cross-connects: there are none")
                state = {}
                continue
            if c.op == "create" and state:
                raise RpcError("data-exists", f"create of cross-connects: {len(state)} pairs exist")
            if c.op == "replace":
                state = {}
            for p in c.pairs:
                held = state.get(p.ingress)
                if p.op in ("merge", "replace"):
                    state[p.ingress] = p.egress
                elif p.op == "create":
                    if held is not None:
                        raise RpcError(
                            "data-exists", f"ingress {p.ingress} is already connected to {held}", path=p.path
                        )
                    state[p.ingress] = p.egress
                elif p.op in ("delete", "remove"):
                    if held is not None and p.egress in (None, held):
                        del state[p.ingress]
                    elif p.op == "delete":
                        now = "not connected" if held is None else f"connected to {held}"
                        raise RpcError(
                            "data-missing",
                            f"no pair {p.ingress}->{p.egress or '*'}: ingress {p.ingress} is {now}",
                            path=p.path,
                        )
                elif held is None:  # "none": the pair must exist
                    raise RpcError("data-missing", f"ingress {p.ingress} is not connected", path=p.path)
        owners: dict[int, int] = {}
        for i, e in sorted(state.items()):
            if e in owners:
                raise RpcError(
                    "in-use",
                    f"egress {e} would carry two circuits (from ingress {owners[e]} and {i})",
                    info={"bad-element": "egress"},
                    path=f"/opsw:cross-connects/opsw:{self.server.options.list_name}[opsw:ingress='{i}']/opsw:egress",
                )
            owners[e] = i
        if state != current:
            try:
                engine.replace_circuits(sorted(state.items()), self.server.clock())
            except SwitchRefused as exc:
                raise RpcError("operation-failed", f"the switch refused the change: {exc}") from None

    def _check_lock(self) -> None:
        owner = self.server.lock_owner
        if owner is not None and owner != self.id:
            # RFC 6241 Appendix A: in-use carries no error-info (lock-denied is the tag with a session-id), so the
            # holder is named in the message only, as a server that follows the RFC sends it.
            raise RpcError("in-use", f"running is locked by session {owner}")

    # -- port-set-state, lock, unlock -------------------------------------------------------------------

    def _port_set_state(self, op: ET.Element, run: Run) -> str:
        enab: list[int] = []
        disab: list[int] = []
        for leaf in op:
            ns, name = split(leaf.tag)
            if ns != OPSW_NS or name not in ("port-enab", "port-disab"):
                raise RpcError("unknown-element", f"port-set-state has no <{name}>", info={"bad-element": name})
            port = self._port("" if len(leaf) else _text(leaf), 1, 2 * self.size, name)
            (enab if name == "port-enab" else disab).append(port)
        both = sorted(set(enab) & set(disab))
        if both:
            raise RpcError(
                "invalid-value", f"port {both[0]} is both enabled and disabled", info={"bad-element": "port-disab"}
            )

        def apply() -> None:
            self._check_lock()
            try:
                self.server.engine.set_ports_enabled(enab, True, "netconf port-set-state")
                self.server.engine.set_ports_enabled(disab, False, "netconf port-set-state")
            except SwitchRefused as exc:
                raise RpcError("operation-failed", f"the switch refused: {exc}") from None

        run(apply)
        return "<ok/>"

    def _lock(self, op: ET.Element, run: Run) -> str:
        self._datastore(self._params(op, ("target",)), "target")

        def take() -> None:
            owner = self.server.lock_owner
            if owner is not None:
                who = "this session" if owner == self.id else f"session {owner}"
                raise RpcError("lock-denied", f"running is locked by {who}", info={"session-id": owner})
            self.server.lock_owner = self.id

        run(take)
        return "<ok/>"

    def _unlock(self, op: ET.Element, run: Run) -> str:
        self._datastore(self._params(op, ("target",)), "target")

        def release() -> None:
            if self.server.lock_owner != self.id:
                held = self.server.lock_owner
                why = "is not locked" if held is None else f"is locked by session {held}"
                raise RpcError("operation-failed", f"running {why}, not by this session")
            self.server.lock_owner = None

        run(release)
        return "<ok/>"


_STATUS = {"E": "ENABLED", "D": "DISABLED", "F": "FAILED"}
_SIZE_IN_MODEL = re.compile(r"\d+x\d+")


def _product(engine: Any) -> tuple[str, str, str, str]:
    """manufacturer, model-name, serial-number, software-version from the SCPI identity (*IDN?), with the model
    name's NxM made to match the switch's real size: ONOS and the driver read the size from it.
    """
    fields = [f.strip() for f in engine.spec.idn.split(",")] + ["Unknown"] * 4
    vendor, model, serial, firmware = fields[:4]
    size = f"{engine.size}x{engine.size}"
    model = _SIZE_IN_MODEL.sub(size, model, count=1) if _SIZE_IN_MODEL.search(model) else f"{model}-{size}"
    return vendor, model, serial, firmware
