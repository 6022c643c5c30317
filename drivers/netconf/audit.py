"""The polatis-netconf driver's own account of its RPCs: what each <rpc> sent to a switch does to its circuits.

`testbed check` replays a run's audit log (each "tx" record: one <rpc> as sent) through this model, never
through the emulator (docs/architecture.md, Decisions). tests/netconf/test_audit_model.py holds the model and the
emulator's server (emulators/netconf/server.py; its edit-config is emulators/netconf/writes.py), two independent
readings of the same rules, to each other by differential fuzzing.

Modelled is what decides the circuits (RFC 6241 §7.2 edit-config on `running`, the optical-switch YANG's
cross-connects list): the operations merge / replace / create / delete / remove on the cross-connects container
and on its pairs (the NETCONF-namespaced operation attribute, and the unqualified one ONOS sends), inherited
downwards from default-operation merge / replace / none; pairs applied in document order; and that an edit the
switch refuses (a malformed request, a port out of range, an egress that would carry two circuits, a pair to
delete that is not there...) changes nothing at all: the switch applies an edit whole or not at all.

Not modelled, because a line alone cannot say: another session's lock on `running` (the switch then refuses the
edit), and the module revision (`pair` from 2017-08-04, `pairs` before): both list names are read, as the driver
sends the one its switch announced.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import defusedxml.ElementTree as SafeET

from drivers.audit import ALL_PORTS
from drivers.scpi.audit import Write

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"
OPERATIONS = ("merge", "replace", "create", "delete", "remove")
_EDIT_PARAMS = ("target", "default-operation", "test-option", "error-option", "config", "url")
_UINT = re.compile(r"[0-9]{1,10}")
_DIGITS = re.compile(r"\s*([0-9]{1,10})\s*")
_XML_DECL = re.compile(rb"\A<\?xml[^>]*?encoding\s*=\s*['\"]([A-Za-z0-9._-]+)['\"]")


class _Refused(Exception):
    """The switch would refuse the edit (it answers an rpc-error and changes nothing)."""


def _q(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


def _text(elem: ET.Element) -> str:
    return (elem.text or "").strip()


def _parse(text: str) -> ET.Element | None:
    """The message as the switch reads it: UTF-8 XML without DTD or entities; None if it would not read it."""
    data = text.encode("utf-8", errors="surrogatepass")
    decl = _XML_DECL.match(data)
    if decl and decl.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
        return None
    try:
        data.decode("utf-8")
        return SafeET.fromstring(data, forbid_dtd=True)
    except Exception:  # defusedxml's refusals, ParseError, a bad encoding: the switch answers malformed-message
        return None


def _operation(elem: ET.Element, inherited: str) -> str:
    value = elem.get(_q(NC_NS, "operation"))
    if value is None:
        value = elem.get("operation")  # as ONOS sends it, without the namespace; the switch takes it
    if value is None:
        return inherited
    if value not in OPERATIONS:
        raise _Refused
    return value


class PolatisNetconfAuditModel:
    """What the edit-config RPCs polatis-netconf sends mean for a size x size switch's circuits."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size  # ingress 1..size, egress size+1..2*size

    # -- writes -----------------------------------------------------------------------------------

    def writes(self, text: str) -> list[Write]:
        """The writes one sent <rpc> names, accepted or not (the audit is of intent): edit-configs with the ports
        their pairs name (unchecked), ALL_PORTS for an edit that may drop every circuit (a replace or delete of
        the list, default-operation replace); port-set-state with its ports. Reads and unreadable text: none.
        """
        root = _parse(text)
        if root is None or root.tag != _q(NC_NS, "rpc"):
            return []
        found = []
        for op in root:
            if op.tag == _q(NC_NS, "edit-config"):
                found.append(self._edit_write(op))
            elif op.tag == _q(OPSW_NS, "port-set-state"):
                ports = frozenset(int(m.group(1)) for leaf in op if (m := _DIGITS.fullmatch(leaf.text or "")))
                found.append(Write("port-set-state", ports))
        return found

    def _edit_write(self, op: ET.Element) -> Write:
        default = next((_text(c) for c in op if c.tag == _q(NC_NS, "default-operation")), "merge")
        clears = default == "replace"
        ports: set[int] = set()
        ops: list[str] = []
        for config in (c for c in op if c.tag in (_q(NC_NS, "config"), "config")):
            for top in config:
                try:
                    top_op = _operation(top, default)
                except _Refused:
                    top_op = "?"
                clears = clears or top_op in ("replace", "delete", "remove")
                for entry in top:
                    try:
                        ops.append(_operation(entry, top_op))
                    except _Refused:
                        ops.append("?")
                    for leaf in entry:
                        if m := _DIGITS.fullmatch(leaf.text or ""):
                            ports.add(int(m.group(1)))
        summary = ", ".join(f"{o} x{ops.count(o)}" for o in dict.fromkeys(ops)) or "no pairs"
        return Write(f"edit-config ({default}): {summary}", ALL_PORTS if clears else frozenset(ports))

    # -- replay -----------------------------------------------------------------------------------

    def replay(self, circuits: dict[int, int], lines: list[str]) -> dict[int, int]:
        """The circuits (ingress -> egress) after the RPCs `lines` were sent, starting from `circuits`; an edit the
        switch would refuse changes nothing, as the switch applies an edit whole or not at all.
        """
        state = dict(circuits)
        for line in lines:
            try:
                state = self._apply(state, line)
            except _Refused:
                pass
        return state

    def _apply(self, state: dict[int, int], text: str) -> dict[int, int]:
        root = _parse(text)
        if root is None or root.tag != _q(NC_NS, "rpc") or "message-id" not in root.attrib:
            raise _Refused
        ops = list(root)
        if len(ops) != 1 or ops[0].tag != _q(NC_NS, "edit-config"):
            return state  # refused, or not an edit: the circuits stay either way
        params: dict[str, ET.Element] = {}
        for child in ops[0]:
            name = child.tag.rpartition("}")[2]
            # a bare <config> too, as the switch takes it (docs/protocols.md §7.6)
            qualified = child.tag.startswith(f"{{{NC_NS}}}") or child.tag == "config"
            if not qualified or name not in _EDIT_PARAMS or name in params:
                raise _Refused
            params[name] = child
        target = params.get("target")
        if target is None or [c.tag for c in target] != [_q(NC_NS, "running")]:
            raise _Refused
        default = self._choice(params, "default-operation", ("merge", "replace", "none"), "merge")
        self._choice(params, "test-option", ("set", "test-then-set"), "set")
        self._choice(params, "error-option", ("stop-on-error", "continue-on-error", "rollback-on-error"), "")
        if "url" in params or "config" not in params:
            raise _Refused
        plan = [self._container(top, default) for top in params["config"]]
        return self._run(state, default, plan)

    @staticmethod
    def _choice(params: dict[str, ET.Element], name: str, allowed: tuple[str, ...], default: str) -> str:
        if name not in params:
            return default
        value = _text(params[name])
        if value not in allowed:
            raise _Refused
        return value

    def _container(self, top: ET.Element, default: str) -> tuple[str, list[tuple[str, int, int | None]]]:
        if top.tag != _q(OPSW_NS, "cross-connects"):
            raise _Refused  # other containers (port-config, voa...) are not edited by this switch model
        op = _operation(top, default)
        child_default = "merge" if op == "create" else op
        pairs = []
        for entry in top:
            if entry.tag not in (_q(OPSW_NS, "pair"), _q(OPSW_NS, "pairs")):
                raise _Refused
            pairs.append(self._pair(entry, child_default))
        return op, pairs

    def _pair(self, entry: ET.Element, inherited: str) -> tuple[str, int, int | None]:
        op = _operation(entry, inherited)
        leaves: dict[str, str] = {}
        for leaf in entry:
            name = leaf.tag.rpartition("}")[2]
            if leaf.tag not in (_q(OPSW_NS, "ingress"), _q(OPSW_NS, "egress")) or name in leaves:
                raise _Refused
            if leaf.get(_q(NC_NS, "operation")) is not None or leaf.get("operation") is not None:
                raise _Refused  # the switch takes operations on the pair, not on its leaves
            leaves[name] = "" if len(leaf) else _text(leaf)
        n = self.size
        if "ingress" not in leaves:
            raise _Refused
        ingress = self._port(leaves["ingress"], 1, n)
        if "egress" in leaves:
            return op, ingress, self._port(leaves["egress"], n + 1, 2 * n)
        if op in ("merge", "replace", "create"):
            raise _Refused  # egress is mandatory to make a circuit
        return op, ingress, None

    @staticmethod
    def _port(text: str, lo: int, hi: int) -> int:
        if not _UINT.fullmatch(text) or not lo <= int(text) <= hi:
            raise _Refused
        return int(text)

    @staticmethod
    def _run(current: dict[int, int], default: str, plan: list) -> dict[int, int]:
        state = {} if default == "replace" else dict(current)  # replace: the config is the whole datastore
        for op, pairs in plan:
            if op in ("delete", "remove"):  # the whole list goes (delete: it must not be empty)
                if op == "delete" and not state:
                    raise _Refused
                state = {}
                continue
            if op == "create" and state:
                raise _Refused
            if op == "replace":
                state = {}
            for pair_op, ingress, egress in pairs:
                held = state.get(ingress)
                if pair_op in ("merge", "replace") or (pair_op == "create" and held is None):
                    state[ingress] = egress
                elif pair_op == "create":
                    raise _Refused  # already connected
                elif pair_op in ("delete", "remove"):
                    if held is not None and egress in (None, held):
                        del state[ingress]
                    elif pair_op == "delete":
                        raise _Refused  # no such pair
                elif held is None:  # "none": only navigates, so the pair must exist
                    raise _Refused
        if len(set(state.values())) < len(state):
            raise _Refused  # an egress would carry two circuits
        return state
