"""A small Polatis optical switch on an independent NETCONF server: the `netconf` package's server (PyPI netconf
2.1.0, module netconf.server, by Christian Hopps), used as it is, with a handler of the optical-switch model
written here. tests/netconf/test_independent_server.py runs it as its own process, in its own virtual environment
(the package's SSH layer, sshutil 1.5.0, needs paramiko before 4.0: it imports paramiko.dsskey), and drives it
with the project's driver (docs/interop.md).

Nothing of the project is imported: the package reads the XML, frames the messages, keeps the locks and answers
close-session; this file only knows the model, in the namespace http://www.polatis.com/yang/optical-switch:
- get / get-config: cross-connects/pair{ingress, egress}, port-config/port{port-id, status (state)},
  opm-power/port{port-id, power} and product-information, filtered by the package's own subtree filter;
- edit-config on running: merge (the default), replace and delete of pairs and of the cross-connects list;
- port-set-state (port-enab, port-disab); lock / unlock are the package's, this handler only says <ok/>;
- rpc-errors as RFC 6241 Appendix A has them: in-use with no error-info when another session holds the lock, and
  with an error-path at the pair when an egress would carry two circuits; invalid-value for a port outside the
  switch; data-missing for a pair to delete that is not there; missing-element for a pair without egress.

Usage: PEER_PASSWORD=... python polatis_peer.py --host-key KEY --size N --transcript FILE [--base10-only]
It prints "port <n>" once it listens on 127.0.0.1, and serves until its standard input closes. Each RPC the
handler sees and what it answers go to the transcript, one JSON object a line ({"rpc": ..., "reply": ...}).

--base10-only: the package cannot be a base:1.0-only server. Its hello always offers base:1.0 and base:1.1, and
it frames in chunks as soon as the client's hello offers base:1.1 (RFC 6242 §4.1 wants both hellos to). The
session class below changes exactly those two: its hello offers base:1.0 only, and a client's base:1.1 is not
taken, so both ends stay in end-of-message framing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import threading

from lxml import etree
from netconf import base, nsmap_add, util
from netconf import error as ncerror
from netconf import server as ncserver

OPSW = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
REVISION = "2018-03-22"
LIT = {1: 0.0, 2: -3.0}  # dBm arriving on ingress ports (the project's tests light the same two)
LOSS_DB = 1.0
DARK = "-99.99"
nsmap_add("opsw", OPSW)


def _path(ingress: int | str, leaf: str = "") -> str:
    return f"/opsw:cross-connects/opsw:pair[opsw:ingress='{ingress}']" + (f"/opsw:{leaf}" if leaf else "")


class PolatisMethods:
    """The optical-switch model for netconf.server.NetconfSSHServer (its rpc_* method-handler object)."""

    def __init__(self, size: int, transcript: str) -> None:
        self.size = size
        self.circuits: dict[int, int] = {}
        self.disabled: set[int] = set()
        self.model = threading.Lock()  # the package runs each session's RPCs on that session's own thread
        self.transcript = open(transcript, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives with the process)

    # -- the package's hooks ----------------------------------------------------------------------

    def nc_append_capabilities(self, capabilities) -> None:
        for cap in (
            "urn:ietf:params:netconf:capability:writable-running:1.0",
            f"{OPSW}?module=optical-switch&revision={REVISION}",
        ):
            util.subelm(capabilities, "capability").text = cap

    def rpc_get(self, session, rpc, filter_or_none):
        return self._answer(rpc, lambda: _filtered(rpc, self._data(False), filter_or_none))

    def rpc_get_config(self, session, rpc, source, filter_or_none):
        def run():
            self._running(rpc, source, "source")
            return _filtered(rpc, self._data(True), filter_or_none)

        return self._answer(rpc, run)

    def rpc_edit_config(self, session, rpc, *params):
        return self._answer(rpc, lambda: self._edit(session, rpc, params))

    def rpc_port_set_state(self, session, rpc, *params):
        return self._answer(rpc, lambda: self._port_set_state(session, rpc, params))

    def rpc_lock(self, session, rpc, target):
        return self._answer(rpc, lambda: util.elm("nc:ok"))  # the package has taken (or refused) the lock

    def rpc_unlock(self, session, rpc, target):
        if rpc is None:  # the package says a closing session's lock was released: nothing to answer
            return None
        return self._answer(rpc, lambda: util.elm("nc:ok"))

    # -- the model --------------------------------------------------------------------------------

    def _answer(self, rpc, run):
        """Run one RPC under the model's lock; note it and its answer (or refusal) in the transcript."""
        try:
            with self.model:
                reply = run()
        except ncerror.RPCServerError as exc:
            self._note(rpc, exc.get_reply_msg())
            raise
        self._note(rpc, etree.tounicode(reply))
        return reply

    def _note(self, rpc, reply: str) -> None:
        self.transcript.write(json.dumps({"rpc": etree.tounicode(rpc), "reply": reply}) + "\n")

    def _data(self, config_only: bool):
        data = util.elm("nc:data")
        cc = util.subelm(data, "opsw:cross-connects")
        for ingress, egress in sorted(self.circuits.items()):
            pair = util.subelm(cc, "opsw:pair")
            util.subelm(pair, "opsw:ingress").text = str(ingress)
            util.subelm(pair, "opsw:egress").text = str(egress)
        ports = util.subelm(data, "opsw:port-config")
        for p in range(1, 2 * self.size + 1):
            port = util.subelm(ports, "opsw:port")
            util.subelm(port, "opsw:port-id").text = str(p)
            if not config_only:
                util.subelm(port, "opsw:status").text = "DISABLED" if p in self.disabled else "ENABLED"
        if config_only:
            return data
        info = util.subelm(data, "opsw:product-information")
        for leaf, value in (
            ("manufacturer", "Polatis"),
            ("model-name", f"N-OST-{self.size}x{self.size}-HU1-DMHNS"),
            ("serial-number", "peer-0001"),
            ("software-version", "netconf-2.1.0-peer"),
        ):
            util.subelm(info, f"opsw:{leaf}").text = value
        power = util.subelm(data, "opsw:opm-power")
        for p in range(1, 2 * self.size + 1):
            port = util.subelm(power, "opsw:port")
            util.subelm(port, "opsw:port-id").text = str(p)
            util.subelm(port, "opsw:power").text = self._power(p)
        return data

    def _power(self, port: int) -> str:
        if port <= self.size:
            source = port
        else:
            source = next((i for i, e in self.circuits.items() if e == port), None)
        if source is None or source not in LIT or source in self.disabled or port in self.disabled:
            return DARK
        return f"{LIT[source] - (LOSS_DB if port > self.size else 0.0):.2f}"

    def _running(self, rpc, holder, what: str) -> None:
        stores = [] if holder is None else list(holder)
        if len(stores) != 1 or stores[0].tag != f"{{{NC}}}running":
            raise ncerror.InvalidValueProtoError(rpc, message=f"<{what}> must be <running>", info={"bad-element": what})

    def _check_lock(self, session, rpc) -> None:
        holder = session.server.is_target_locked("running")
        if holder and holder != session.session_id:
            # RFC 6241 Appendix A: in-use has no error-info (lock-denied is the tag that names the holder)
            raise ncerror.RPCServerError(rpc, "protocol", "in-use", message="the running datastore is locked")

    def _port(self, rpc, text: str | None, lo: int, hi: int, leaf: str, path: str):
        text = (text or "").strip()
        if not text.isdigit() or not lo <= int(text) <= hi:
            raise ncerror.InvalidValueAppError(
                rpc, message=f"{leaf} {text!r} is not in {lo}..{hi}", path=path, info={"bad-element": leaf}
            )
        return int(text)

    def _edit(self, session, rpc, params):
        by_name = {etree.QName(p).localname: p for p in params if etree.QName(p).namespace == NC}
        self._running(rpc, by_name.get("target"), "target")
        default = (by_name["default-operation"].text or "").strip() if "default-operation" in by_name else "merge"
        config = by_name.get("config")
        if config is None:
            raise ncerror.MissingElementProtoError(rpc, util.qname("nc:config"))
        self._check_lock(session, rpc)
        state = {} if default == "replace" else dict(self.circuits)
        op_attr = f"{{{NC}}}operation"
        n = self.size
        for top in config:
            if top.tag != f"{{{OPSW}}}cross-connects":
                raise ncerror.UnknownElementProtoError(rpc, top)
            top_op = top.get(op_attr, default)
            if top_op in ("replace", "delete"):
                state = {}
            for entry in top:
                if entry.tag != f"{{{OPSW}}}pair":
                    raise ncerror.UnknownElementProtoError(rpc, entry)
                op = entry.get(op_attr, "merge" if top_op == "replace" else top_op)
                ingress = self._port(rpc, entry.findtext(f"{{{OPSW}}}ingress"), 1, n, "ingress", _path("?"))
                egress_text = entry.findtext(f"{{{OPSW}}}egress")
                egress = None
                if egress_text is not None:
                    egress = self._port(rpc, egress_text, n + 1, 2 * n, "egress", _path(ingress, "egress"))
                if op == "delete":
                    if ingress not in state or egress not in (None, state[ingress]):
                        raise ncerror.DataMissingAppError(
                            rpc, message=f"no pair {ingress}->{egress}", path=_path(ingress)
                        )
                    del state[ingress]
                elif op in ("merge", "replace"):
                    if egress is None:
                        raise ncerror.MissingElementAppError(rpc, util.qname("opsw:egress"), path=_path(ingress))
                    state[ingress] = egress
                else:
                    raise ncerror.OperationNotSupportedProtoError(rpc, message=f"operation {op!r} on a pair")
        holders: dict[int, int] = {}
        for ingress, egress in sorted(state.items()):
            if egress in holders:
                raise ncerror.RPCServerError(
                    rpc,
                    "application",
                    "in-use",
                    message=f"egress {egress} is already connected to ingress {holders[egress]}",
                    path=_path(ingress, "egress"),
                    info={"bad-element": "egress"},
                )
            holders[egress] = ingress
        self.circuits = state  # all or nothing: only a whole edit that passed every check lands
        return util.elm("nc:ok")

    def _port_set_state(self, session, rpc, params):
        self._check_lock(session, rpc)
        enable, disable = set(), set()
        for leaf in params:
            name = etree.QName(leaf).localname
            if etree.QName(leaf).namespace != OPSW or name not in ("port-enab", "port-disab"):
                raise ncerror.UnknownElementProtoError(rpc, leaf)
            port = self._port(rpc, leaf.text, 1, 2 * self.size, name, f"/opsw:port-set-state/opsw:{name}")
            (enable if name == "port-enab" else disable).add(port)
        self.disabled = (self.disabled - enable) | disable
        return util.elm("nc:ok")


def _filtered(rpc, data, filter_or_none):
    """The package's subtree filter (netconf.util.filter_results), one top-level filter node at a time.

    Two gaps of the package's filter are filled here, because the driver meets both on every call: it turns only
    the filter's first top-level node into XPath, and a top-level selection node (an empty <cross-connects/>,
    RFC 6241 §6.2.4: the whole container) becomes an empty expression that lxml refuses ("Invalid expression").
    A top-level selection node selects its container here; any other node goes to the package's filter alone.
    """
    if filter_or_none is None:
        return data
    result = util.elm("nc:data")
    for node in filter_or_none:
        if len(node) == 0 and not (node.text or "").strip():
            name = etree.QName(node)
            picked = [
                c
                for c in data
                if etree.QName(c).localname == name.localname and name.namespace in (None, etree.QName(c).namespace)
            ]
            result.extend(copy.deepcopy(c) for c in picked)
            continue
        alone = util.elm("nc:filter", {"type": "subtree"})
        alone.append(copy.deepcopy(node))
        result.extend(util.filter_results(rpc, data, alone).getchildren())
    return result


class _NoBase11(set):
    """The client's capabilities as a base:1.0-only server keeps them: without base:1.1."""

    def add(self, item) -> None:
        if item != base.NC_BASE_11:
            super().add(item)


class Base10OnlySession(ncserver.NetconfServerSession):
    """The package's session, with a hello that offers base:1.0 only and no chunked framing (see the module)."""

    def send_hello(self, caplist, session_id=None):
        self.capabilities = _NoBase11()  # read by the package right after this hello, to choose the framing
        super().send_hello([c for c in caplist if c != base.NC_BASE_11], session_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-key", required=True)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--user", default="admin")
    parser.add_argument("--transcript", required=True)
    parser.add_argument("--base10-only", action="store_true")
    args = parser.parse_args()
    control = ncserver.SSHUserPassController(username=args.user, password=os.environ["PEER_PASSWORD"])
    methods = PolatisMethods(args.size, args.transcript)
    server = ncserver.NetconfSSHServer(server_ctl=control, server_methods=methods, port=0, host_key=args.host_key)
    if args.base10_only:
        server.server_session_class = Base10OnlySession  # before any client: the port is not announced yet
    print(f"port {server.port}", flush=True)
    sys.stdin.read()  # until the test closes our standard input
    os._exit(0)  # the package's threads are daemons holding sockets: leave without waiting on them


if __name__ == "__main__":
    main()
