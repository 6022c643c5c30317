"""The writes of `running`: edit-config of the cross-connects and the optical-switch RPC port-set-state, checked
whole, then applied at once or not at all (:rollback-on-error), refused while another session holds the lock.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from emulators.netconf.params import check_running, choice, op_params
from emulators.netconf.protocol import MOTION_NS, NC_NS, OPSW_NS, RpcError, Run
from emulators.netconf.switch import Switch
from emulators.netconf.xmltree import UINT, split, text_of
from emulators.scpi.ocs import SwitchRefused

OPERATIONS = ("merge", "replace", "create", "delete", "remove")
# optical-switch containers this server knows but does not let edit-config change.
_OPSW_OTHER = {
    "product-information", "port-config", "opm-power", "opm-config", "opm-alarm-config", "voa", "ports",
    "system-config", "aps", "subswitches", "groups",
}  # fmt: skip


@dataclass
class _Pair:
    """One cross-connect pair of an edit-config, its operation resolved (inherited or its own)."""

    op: str
    ingress: int
    egress: int | None
    path: str


@dataclass
class _Container:
    """The cross-connects container of an edit-config: its operation and its pairs."""

    op: str
    pairs: list[_Pair] = field(default_factory=list)


class RunningWrites:
    """The writes one session makes to the switch's `running`: circuits (edit-config) and port states."""

    def __init__(self, server: Switch, session_id: int) -> None:
        self.server = server
        self.session_id = session_id

    @property
    def size(self) -> int:
        """The switch's N (an NxN switch: ingress ports 1..N, egress N+1..2N)."""
        return self.server.engine.size

    def edit_config(self, op: ET.Element, run: Run) -> str:
        """<edit-config> of the cross-connects -> the body of its reply (<ok/>); all or nothing."""
        params = op_params(
            op, ("target", "default-operation", "test-option", "error-option", "config", "url"), unqualified=("config",)
        )
        check_running(params, "target")
        default_op = choice(params, "default-operation", ("merge", "replace", "none"), "merge")
        choice(params, "test-option", ("set", "test-then-set"), "set")  # without :validate both just set
        choice(params, "error-option", ("stop-on-error", "continue-on-error", "rollback-on-error"), "")
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
            leaves[name] = "" if len(leaf) else text_of(leaf)
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
        if not UINT.fullmatch(text) or not lo <= int(text) <= hi:
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
        if owner is not None and owner != self.session_id:
            # RFC 6241 Appendix A: in-use carries no error-info (lock-denied is the tag with a session-id), so the
            # holder is named in the message only, as a server that follows the RFC sends it.
            raise RpcError("in-use", f"running is locked by session {owner}")

    def port_set_state(self, op: ET.Element, run: Run) -> str:
        """The optical-switch RPC port-set-state -> the body of its reply (<ok/>)."""
        enab: list[int] = []
        disab: list[int] = []
        for leaf in op:
            ns, name = split(leaf.tag)
            if ns != OPSW_NS or name not in ("port-enab", "port-disab"):
                raise RpcError("unknown-element", f"port-set-state has no <{name}>", info={"bad-element": name})
            port = self._port("" if len(leaf) else text_of(leaf), 1, 2 * self.size, name)
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
