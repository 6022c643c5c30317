"""HUBER+SUHNER Polatis optical circuit switch over NETCONF (SSH port 830), on ncclient (docs/protocols.md §7).

The YANG it speaks is the switch's `optical-switch` module (http://www.polatis.com/yang/optical-switch), as ONOS's
Polatis driver does: circuits are `cross-connects/pair{ingress, egress}` (`pairs` before module revision
2017-08-04; the revision is read from the server's hello), changed with edit-config on `running` (merge to
connect, delete to disconnect, replace of the whole list to clear it); power is `opm-power/port{port-id, power}`;
port state `port-config/port{port-id, status}`; enable/disable the RPC `port-set-state`; identity
`product-information`, whose model name carries the port count (N-OST-32x32-...).

The session (SSH, host keys, ncclient, the audit of every RPC) is drivers/netconf/session.py's; what to try after
a refusal, drivers/netconf/hints.py's.

Deliberate choices:
- wait_settled: NETCONF has no *OPC?, and the Polatis YANG no "moving" leaf. A server that advertises the
  project's switch-motion module (the emulator does) is asked how long until its last move settles
  (`settle-remaining-us`), and the driver sleeps until the end it reports, then asks once more to confirm (0),
  asking again only if the switch still reports a move; nothing is asked when no edit went out since the switch
  last said 0. Any other server: the driver waits `settle_s` (50 ms: the vendor's "sub-50 ms" switching claim)
  after its own last change.
- check=False: the edit-config reply is still read (NETCONF answers every RPC), but a refusal is kept and
  raised by the next check_errors(), as the SCPI driver's error queue does.
- A reconfiguration is one edit-config: a disconnect(check=False) is held until the next call, and when that is
  a connect(check=False) (as ocs.reconfigure does) both go out in one edit-config, the deletes before the merges.
  The switch applies it whole or not at all (RFC 6241 §7.2), so a refusal of either part changes nothing, and
  check_errors() reports it once. Any other call, check_errors(), wait_settled() and close() send the held
  deletes first, alone, so the switch always sees the calls in the order they were made.
"""

from __future__ import annotations

import operator
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qs

from drivers.audit import AuditSink
from drivers.capabilities import CircuitSwitch, Identity, PortControl
from drivers.errors import DeviceCommandError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.netconf.hints import port_hint, refusal_hint
from drivers.netconf.session import NC_NS, NetconfSession, Reply, qname, text_of
from drivers.netconf.settings import NetconfSettings

OPSW_NS = "http://www.polatis.com/yang/optical-switch"
MOTION_NS = "urn:testbed:yang:switch-motion"  # the project's module: how long until the mirrors settle [P]
PAIR_REVISION = "2017-08-04"  # the list is `pair` from this optical-switch revision on, `pairs` before (ONOS)
PORTS_PER_QUERY = 256  # ports named in one get, as the SCPI driver chunks :PMON:POW?
DEFAULT_SETTLE_S = 0.05
STATES = {"ENABLED": "E", "DISABLED": "D", "FAILED": "F", "UNSUPPORTED": "E"}  # no shutter: the light passes
_SIZE = re.compile(r"(\d+)x(\d+)")


class PolatisNetconf(CircuitSwitch, PortControl):
    """A Polatis switch over NETCONF (CircuitSwitch capability). Ingress ports 1..N, egress N+1..2N.

    Connects on first use; a session that dropped is opened again before the next RPC (never in the middle
    of one, so nothing is sent twice).
    """

    def __init__(
        self,
        settings: NetconfSettings,
        device: str,
        audit: AuditSink | None = None,
        *,
        settle_s: float = DEFAULT_SETTLE_S,
    ) -> None:
        self.settings = settings
        self.device = device
        self.audit = audit
        self.address = settings.address
        self.settle_s = settle_s
        self._session = NetconfSession(settings, device, audit)
        self._lock = threading.RLock()
        self._deferred: list[DeviceCommandError] = []
        self._size: tuple[int, int] | None = None
        self._last_change: float | None = None  # when the switch last accepted a change of circuits
        self._unsettled = False  # an edit went out since the switch last said its mirrors were still
        self._pending: list[list[int]] = []  # pairs of a disconnect(check=False) not sent yet (see connect)

    @property
    def revision(self) -> str | None:
        """The optical-switch module revision the server announced (None before the first session)."""
        return _revision(self._session.capabilities)

    @property
    def motion(self) -> bool:
        """Whether the server serves the switch-motion module (False before the first session)."""
        return any(c.startswith(MOTION_NS) for c in self._session.capabilities)

    # -- identity and geometry --------------------------------------------------------------------

    def identify(self) -> Identity:
        reply = self._get(f'<product-information xmlns="{OPSW_NS}"/>', "product-information")
        node = reply.data.find(qname(OPSW_NS, "product-information"))
        names = ("manufacturer", "model-name", "serial-number", "software-version")
        values = [text_of(None if node is None else node.find(qname(OPSW_NS, n))) for n in names]
        if not all(values):
            missing = [n for n, v in zip(names, values, strict=True) if not v]
            raise self._protocol(reply, f"product-information with {', '.join(names)}; missing {missing}")
        return Identity(*values)

    def size(self) -> tuple[int, int]:
        """From the model name (N-OST-32x32-...), as ONOS reads it; else half the ports port-config lists."""
        if self._size is None:
            model = self.identify().model
            m = _SIZE.search(model)
            if m:
                self._size = (int(m.group(1)), int(m.group(2)))
            else:
                reply = self._get(f'<port-config xmlns="{OPSW_NS}"><port><port-id/></port></port-config>', "ports")
                ports = reply.data.findall(f"{qname(OPSW_NS, 'port-config')}/{qname(OPSW_NS, 'port')}")
                if not ports or len(ports) % 2:
                    raise self._protocol(reply, f"a model name with NxM (got {model!r}), or 2N ports in port-config")
                self._size = (len(ports) // 2, len(ports) // 2)
        return self._size

    # -- circuits ---------------------------------------------------------------------------------

    def connect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        adds = _ordered(pairs)
        with self._lock:
            if check or not self._pending:
                self._flush()
                self._edit_pairs([], adds, check, "connect")
            else:  # the disconnect(check=False) before it goes out with it: one edit-config
                deletes, self._pending = self._pending, []
                self._edit_pairs(deletes, adds, check, "disconnect and connect")

    def disconnect(self, pairs: Iterable[tuple[int, int]], *, check: bool = True) -> None:
        deletes = _ordered(pairs)
        with self._lock:
            self._flush()
            if check or not deletes:
                self._edit_pairs(deletes, [], check, "disconnect")
            else:  # held for a connect(check=False); any other call sends it first (_flush)
                self._pending = deletes

    def disconnect_all(self) -> None:
        # replace with an empty list: a delete of the container would be refused (data-missing) when it is empty
        cc = f'<cross-connects xmlns="{OPSW_NS}" xmlns:nc="{NC_NS}" nc:operation="replace"/>'
        self._edit(cc, "disconnect_all", check=True)

    def check_errors(self, after: str = "the previous commands") -> None:
        """Raise DeviceCommandError for the refusals of writes sent with check=False, then forget them."""
        with self._lock:
            self._flush()
            errors, self._deferred = self._deferred, []
        if not errors:
            return
        first = errors[0]
        raise self._session.error(
            DeviceCommandError,
            f"the switch refused {len(errors)} write(s) of {after}; the first: {first.message}",
            sent=first.sent,
            received="\n".join(str(e.received) for e in errors),
            hint=first.hint,
        )

    def wait_settled(self) -> None:
        with self._lock:
            self._flush()
            self._session.manager()
            if not self.motion:  # a server without the switch-motion module: wait the settle time
                if self._last_change is not None:
                    time.sleep(max(0.0, self._last_change + self.settle_s - time.monotonic()))
                return
            if not self._unsettled:  # nothing sent since the switch said it was still: no RPC
                return
            # Ask once, sleep until the end it reports, confirm with one more ask (it then says 0).
            deadline = time.monotonic() + self.settings.timeout_s
            while True:
                reply = self._get(
                    f'<switch-motion xmlns="{MOTION_NS}"><settle-remaining-us/></switch-motion>', "motion"
                )
                path = f"{qname(MOTION_NS, 'switch-motion')}/{qname(MOTION_NS, 'settle-remaining-us')}"
                text = text_of(reply.data.find(path))
                if not text.isdigit():
                    raise self._protocol(reply, "switch-motion/settle-remaining-us, a whole number of microseconds")
                remaining = int(text) / 1e6
                if remaining == 0:
                    self._unsettled = False
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._session.error(
                        DeviceTimeout,
                        f"the switch still reports moving mirrors after {self.settings.timeout_s:g} s",
                        sent=reply.sent,
                        received=reply.raw,
                        hint="a move takes tens of ms: check the switch's alarms (a port may have failed)",
                    )
                time.sleep(min(remaining, left))

    def connections(self) -> dict[int, int]:
        op = (
            f'<get-config xmlns="{NC_NS}"><source><running/></source>'
            f'<filter type="subtree"><cross-connects xmlns="{OPSW_NS}"/></filter></get-config>'
        )
        reply = self._rpc(op, "get-config cross-connects")
        pairs: dict[int, int] = {}
        for entry in reply.data.iterfind(f"{qname(OPSW_NS, 'cross-connects')}/*"):
            if entry.tag not in (qname(OPSW_NS, "pair"), qname(OPSW_NS, "pairs")):
                continue
            i, e = text_of(entry.find(qname(OPSW_NS, "ingress"))), text_of(entry.find(qname(OPSW_NS, "egress")))
            if not (i.isdigit() and e.isdigit()):
                raise self._protocol(reply, "cross-connect pairs of whole-number ingress and egress ports")
            pairs[int(i)] = int(e)
        return pairs

    # -- ports ------------------------------------------------------------------------------------

    def port_power(self, ports: Iterable[int]) -> dict[int, float]:
        result: dict[int, float] = {}
        for chunk in _chunks(_ports(ports), PORTS_PER_QUERY):
            values, reply = self._port_leaves("opm-power", "power", chunk)
            try:
                result.update({p: float(v) for p, v in values.items()})
            except ValueError:
                raise self._protocol(reply, "opm-power/port/power in dBm, a decimal number") from None
        return result

    def port_states(self, ports: Iterable[int]) -> dict[int, str]:
        result: dict[int, str] = {}
        for chunk in _chunks(_ports(ports), PORTS_PER_QUERY):
            values, reply = self._port_leaves("port-config", "status", chunk)
            bad = {p: v for p, v in values.items() if v not in STATES}
            if bad:
                raise self._protocol(reply, f"port-config/port/status ENABLED, DISABLED or FAILED, got {bad}")
            result.update({p: STATES[v] for p, v in values.items()})
        return result

    def set_port_enabled(self, ports: Iterable[int], enabled: bool) -> None:
        port_list = _ports(ports)
        if port_list:
            leaf = "port-enab" if enabled else "port-disab"
            body = "".join(f"<{leaf}>{p}</{leaf}>" for p in port_list)
            self._rpc(f'<port-set-state xmlns="{OPSW_NS}">{body}</port-set-state>', "port-set-state")

    def close(self) -> None:
        with self._lock:
            try:
                self._flush()  # a disconnect(check=False) still held goes out before the session ends
            except DeviceError:
                pass  # closing anyway
            self._session.close()

    def __enter__(self) -> PolatisNetconf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Send the deletes a disconnect(check=False) left for a connect(check=False) that did not come next."""
        with self._lock:
            deletes, self._pending = self._pending, []
            if deletes:
                self._edit_pairs(deletes, [], False, "disconnect")

    def _edit_pairs(self, deletes: list[list[int]], merges: list[list[int]], check: bool, what: str) -> None:
        """One edit-config: the deletes, then the merges. The switch applies an edit-config whole or not at all
        (RFC 6241 §7.2), its pairs in document order, so a circuit moved from one egress port to another, or an
        egress handed from one ingress to another, is one change, checked on the circuits it leaves.
        """
        if deletes or merges:
            name = self._list_name()

            def entries(pairs: list[list[int]], attr: str) -> str:
                return "".join(f"<{name}{attr}><ingress>{i}</ingress><egress>{e}</egress></{name}>" for i, e in pairs)

            body = entries(deletes, ' nc:operation="delete"') + entries(merges, "")
            self._edit(f'<cross-connects xmlns="{OPSW_NS}" xmlns:nc="{NC_NS}">{body}</cross-connects>', what, check)

    def _edit(self, cross_connects: str, what: str, check: bool) -> None:
        op = f'<edit-config xmlns="{NC_NS}"><target><running/></target><config>{cross_connects}</config></edit-config>'
        with self._lock:
            self._unsettled = True  # from before it is sent: a timeout leaves unknown whether mirrors move
            _, refusal = self._send(op, what)
            if refusal is None:
                self._last_change = time.monotonic()
            elif check:
                raise refusal
            else:  # kept for check_errors
                self._deferred.append(refusal)

    def _list_name(self) -> str:
        with self._lock:
            self._session.manager()  # the revision comes with the server's hello
            return "pairs" if self.revision is not None and self.revision < PAIR_REVISION else "pair"

    def _get(self, subtree: str, what: str) -> Reply:
        return self._rpc(f'<get xmlns="{NC_NS}"><filter type="subtree">{subtree}</filter></get>', f"get {what}")

    def _port_leaves(self, container: str, leaf: str, ports: list[int]) -> tuple[dict[int, str], Reply]:
        entries = "".join(f"<port><port-id>{p}</port-id><{leaf}/></port>" for p in ports)
        reply = self._get(f'<{container} xmlns="{OPSW_NS}">{entries}</{container}>', container)
        found: dict[int, str] = {}
        for port in reply.data.iterfind(f"{qname(OPSW_NS, container)}/{qname(OPSW_NS, 'port')}"):
            pid = text_of(port.find(qname(OPSW_NS, "port-id")))
            if pid.isdigit():
                found[int(pid)] = text_of(port.find(qname(OPSW_NS, leaf)))
        missing = [p for p in ports if p not in found]
        if missing:
            raise self._session.error(
                DeviceCommandError,
                f"the switch reports no {container} for port(s) {missing[:8]}: it has no such port",
                sent=reply.sent,
                received=reply.raw,
                hint=port_hint(self._size, self.size),
            )
        return {p: found[p] for p in ports}, reply

    def _rpc(self, op: str, what: str) -> Reply:
        """Send one RPC; its exchange, or DeviceCommandError for a refusal."""
        reply, refusal = self._send(op, what)
        if refusal is not None:
            raise refusal
        return reply

    def _send(self, op: str, what: str) -> tuple[Reply, DeviceCommandError | None]:
        """Send one RPC; the exchange, and the error that says why the switch refused it (None: it did not). Held
        deletes go first, so the switch sees the calls in the order they were made.
        """
        with self._lock:
            self._flush()
            reply = self._session.execute(self._session.manager(), op)
            errors = reply.root.findall(qname(NC_NS, "rpc-error"))
            return reply, (self._command_error(what, reply, errors) if errors else None)

    def _command_error(self, what: str, reply: Reply, errors: list[ET.Element]) -> DeviceCommandError:
        first = errors[0]
        tag = text_of(first.find(qname(NC_NS, "error-tag")))
        message = text_of(first.find(qname(NC_NS, "error-message")))
        info = first.find(qname(NC_NS, "error-info"))
        details = {c.tag.rpartition("}")[2]: text_of(c) for c in ([] if info is None else info)}
        path = text_of(first.find(qname(NC_NS, "error-path")))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return self._session.error(
            DeviceCommandError,
            f"the switch refused {what}: {tag}: {message}{more}",
            sent=reply.sent,
            received=reply.raw,
            hint=refusal_hint(
                tag, details, path, revision=self.revision, ports=self._port_hint, lock_holder=self._session.lock_holder
            ),
        )

    def _port_hint(self) -> str:
        return port_hint(self._size, self.size)

    def _protocol(self, reply: Reply, expected: str) -> DeviceProtocolError:
        return self._session.error(
            DeviceProtocolError,
            f"unexpected reply: expected {expected}",
            sent=reply.sent,
            received=reply.raw,
            hint="is this a Polatis switch with the optical-switch YANG module? (see its hello capabilities)",
        )


def _revision(capabilities: Sequence[str]) -> str | None:
    """The optical-switch revision from its capability URI `...optical-switch?module=optical-switch&revision=D`."""
    for cap in capabilities:
        base, _, query = cap.partition("?")
        if base == OPSW_NS:
            revisions = parse_qs(query).get("revision")
            return revisions[0] if revisions else None
    return None


def _ordered(pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Each pair (a, b) as [ingress, egress]: the ingress is the lower number."""
    return [sorted((operator.index(a), operator.index(b))) for a, b in pairs]


def _ports(ports: Iterable[int]) -> list[int]:
    # operator.index: a float or a string must fail here, not go out on the wire as "3.0" or "'3'".
    return [operator.index(p) for p in ports]


def _chunks(items: list[int], n: int) -> Iterable[list[int]]:
    return (items[i : i + n] for i in range(0, len(items), n))
