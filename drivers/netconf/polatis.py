"""HUBER+SUHNER Polatis optical circuit switch over NETCONF (SSH port 830), on ncclient (docs/protocols.md §7).

The YANG it speaks is the switch's `optical-switch` module (http://www.polatis.com/yang/optical-switch), as ONOS's
Polatis driver does: circuits are `cross-connects/pair{ingress, egress}` (`pairs` before module revision
2017-08-04; the revision is read from the server's hello), changed with edit-config on `running` (merge to
connect, delete to disconnect, replace of the whole list to clear it); power is `opm-power/port{port-id, power}`;
port state `port-config/port{port-id, status}`; enable/disable the RPC `port-set-state`; identity
`product-information`, whose model name carries the port count (N-OST-32x32-...).

Deliberate choices:
- Host keys are checked against the known_hosts file with ncclient's own options: the key listed for
  `[host]:port` is handed to `manager.connect(hostkey_b64=...)` with `hostkey_verify=True`, so the server must
  present exactly that key; a host missing from the file is refused before any connection is made.
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
- Every RPC is audited as the exact <rpc> XML ncclient sends and the <rpc-reply> XML it receives; replies are
  re-read with defusedxml (no DTDs, no entities), whatever ncclient's own parse made of them.
"""

from __future__ import annotations

import operator
import os
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs

import defusedxml.ElementTree as SafeET
import paramiko
from defusedxml import DefusedXmlException
from ncclient import manager
from ncclient.operations.errors import TimeoutExpiredError
from ncclient.operations.rpc import RPC, RaiseMode
from ncclient.transport import session as _nc_session
from ncclient.transport.errors import AuthenticationError, SSHUnknownHostError, TransportError
from ncclient.transport.errors import SessionError as NcSessionError
from ncclient.xml_ import to_ele

from drivers.audit import AuditSink, record
from drivers.capabilities import Identity
from drivers.errors import (
    DeviceCommandError,
    DeviceConnectionError,
    DeviceError,
    DeviceProtocolError,
    DeviceTimeout,
    switch_ports_hint,
)
from drivers.netconf.settings import NetconfSettings

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"
MOTION_NS = "urn:testbed:yang:switch-motion"  # the project's module: how long until the mirrors settle [P]
PAIR_REVISION = "2017-08-04"  # the list is `pair` from this optical-switch revision on, `pairs` before (ONOS)
PORTS_PER_QUERY = 256  # ports named in one get, as the SCPI driver chunks :PMON:POW?
DEFAULT_SETTLE_S = 0.05
STATES = {"ENABLED": "E", "DISABLED": "D", "FAILED": "F", "UNSUPPORTED": "E"}  # no shutter: the light passes
HOST_KEY_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_SIZE = re.compile(r"(\d+)x(\d+)")
CONNECTION_LOST = (TransportError, NcSessionError, OSError, EOFError, paramiko.SSHException)

# ncclient's session thread looks at its queue of messages to send only between selects of TICK = 0.1 s, so every
# RPC waits up to one TICK before it leaves, and a reconfiguration makes several in sequence. A shorter TICK costs
# an idle session a little CPU (docs/tuning.md, "NETCONF: ncclient's TICK").
# TICK is ncclient's module constant: it applies to every ncclient session of the process that imports this driver,
# not to this driver's alone. Only ever lowered.
_nc_session.TICK = min(_nc_session.TICK, 0.001)


class _AuditedRpc(RPC):
    """An RPC whose XML, exactly as ncclient puts it on the wire, is handed to `on_sent` first (Manager.execute
    builds it; errors are judged by the driver, so ncclient raises none).
    """

    def request(self, op, on_sent, close: bool = False):
        self._on_sent = on_sent
        self._raise_mode = RaiseMode.NONE
        try:
            return self._request(op)
        finally:
            if close:
                self._session.close()

    def _wrap(self, subele) -> str:
        xml = super()._wrap(subele)
        self._on_sent(xml)
        return xml


@dataclass(frozen=True)
class _Reply:
    """One exchange: the <rpc> as sent, the <rpc-reply> as received, and the reply parsed."""

    sent: str
    raw: str
    root: ET.Element

    @property
    def data(self) -> ET.Element:
        found = self.root.find(_q(NC_NS, "data"))
        return ET.Element(_q(NC_NS, "data")) if found is None else found


def _q(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


def _text(elem: ET.Element | None) -> str:
    return "" if elem is None else (elem.text or "").strip()


class PolatisNetconf:
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
        self.revision: str | None = None  # the optical-switch module revision the server announced
        self.motion = False  # whether it serves the switch-motion module
        self._m = None
        self._lock = threading.RLock()
        self._deferred: list[DeviceCommandError] = []
        self._size: tuple[int, int] | None = None
        self._last_change: float | None = None  # when the switch last accepted a change of circuits
        self._unsettled = False  # an edit went out since the switch last said its mirrors were still
        self._pending: list[list[int]] = []  # pairs of a disconnect(check=False) not sent yet (see connect)

    # -- identity and geometry --------------------------------------------------------------------

    def identify(self) -> Identity:
        reply = self._get(f'<product-information xmlns="{OPSW_NS}"/>', "product-information")
        node = reply.data.find(_q(OPSW_NS, "product-information"))
        names = ("manufacturer", "model-name", "serial-number", "software-version")
        values = [_text(None if node is None else node.find(_q(OPSW_NS, n))) for n in names]
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
                ports = reply.data.findall(f"{_q(OPSW_NS, 'port-config')}/{_q(OPSW_NS, 'port')}")
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
        raise self._error(
            DeviceCommandError,
            f"the switch refused {len(errors)} write(s) of {after}; the first: {first.message}",
            sent=first.sent,
            received="\n".join(str(e.received) for e in errors),
            hint=first.hint,
        )

    def wait_settled(self) -> None:
        with self._lock:
            self._flush()
            self._manager()
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
                path = f"{_q(MOTION_NS, 'switch-motion')}/{_q(MOTION_NS, 'settle-remaining-us')}"
                text = _text(reply.data.find(path))
                if not text.isdigit():
                    raise self._protocol(reply, "switch-motion/settle-remaining-us, a whole number of microseconds")
                remaining = int(text) / 1e6
                if remaining == 0:
                    self._unsettled = False
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._error(
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
        for entry in reply.data.iterfind(f"{_q(OPSW_NS, 'cross-connects')}/*"):
            if entry.tag not in (_q(OPSW_NS, "pair"), _q(OPSW_NS, "pairs")):
                continue
            i, e = _text(entry.find(_q(OPSW_NS, "ingress"))), _text(entry.find(_q(OPSW_NS, "egress")))
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
            m, self._m = self._m, None
            if m is not None and m.connected:
                try:
                    self._execute(m, f'<close-session xmlns="{NC_NS}"/>', close=True)
                except (DeviceError, *CONNECTION_LOST):
                    pass  # closing anyway

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
            if self._rpc(op, what, check=check) is not None:
                self._last_change = time.monotonic()

    def _list_name(self) -> str:
        with self._lock:
            self._manager()  # the revision comes with the server's hello
            return "pairs" if self.revision is not None and self.revision < PAIR_REVISION else "pair"

    def _get(self, subtree: str, what: str) -> _Reply:
        return self._rpc(f'<get xmlns="{NC_NS}"><filter type="subtree">{subtree}</filter></get>', f"get {what}")

    def _port_leaves(self, container: str, leaf: str, ports: list[int]) -> tuple[dict[int, str], _Reply]:
        entries = "".join(f"<port><port-id>{p}</port-id><{leaf}/></port>" for p in ports)
        reply = self._get(f'<{container} xmlns="{OPSW_NS}">{entries}</{container}>', container)
        found: dict[int, str] = {}
        for port in reply.data.iterfind(f"{_q(OPSW_NS, container)}/{_q(OPSW_NS, 'port')}"):
            pid = _text(port.find(_q(OPSW_NS, "port-id")))
            if pid.isdigit():
                found[int(pid)] = _text(port.find(_q(OPSW_NS, leaf)))
        missing = [p for p in ports if p not in found]
        if missing:
            raise self._error(
                DeviceCommandError,
                f"the switch reports no {container} for port(s) {missing[:8]}: it has no such port",
                sent=reply.sent,
                received=reply.raw,
                hint=self._port_hint(),
            )
        return {p: found[p] for p in ports}, reply

    def _manager(self):
        """The open NETCONF session, opened (again) if there is none."""
        with self._lock:
            if self._m is None or not self._m.connected:
                self._m = None
                self._m = self._connect()
            return self._m

    def _connect(self):
        s = self.settings
        known_hosts = os.path.expanduser(s.known_hosts or "~/.ssh/known_hosts")
        name = s.host if s.port == 22 else f"[{s.host}]:{s.port}"
        keyscan = f"ssh-keyscan -p {s.port} -t ed25519,ecdsa,rsa {s.host} >> {known_hosts}"
        key = self._known_host_key(known_hosts, name, keyscan)
        try:
            m = manager.connect(
                host=s.host,
                port=s.port,
                username=s.user,
                password=s.password,
                key_filename=s.key_file,
                allow_agent=s.key_file is None and s.password is None,
                look_for_keys=False,
                hostkey_verify=True,
                hostkey_b64=key.get_base64(),
                timeout=s.timeout_s,
                manager_params={"timeout": s.timeout_s},
                device_params={"name": "default"},
            )
        except SSHUnknownHostError as exc:
            raise self._connection_error(
                f"the host key of {name} does not match the one in {known_hosts} (the switch presented "
                f"{exc.fingerprint}, the file lists {key.get_name()} {key.fingerprint}): the switch was replaced or "
                "reinstalled, or someone is in between",
                f"find out which; if the change is expected, remove the old key with `ssh-keygen -f {known_hosts} "
                f"-R '{name}'`, then verify and add the new one ({keyscan})",
                exc,
            ) from exc
        except AuthenticationError as exc:
            how = "the keys in the SSH agent"
            if s.key_file:
                how = f"the key {s.key_file}"
            elif s.password is not None:
                how = f"the password from ${s.password_env}" if s.password_env else "the password"
            raise self._connection_error(
                f"authentication as {s.user!r} failed with {how}: {exc}",
                "check user, key_file or password_env in the inventory's netconf transport, and that the switch "
                "has this user with that key or password",
                exc,
            ) from exc
        except (*CONNECTION_LOST, ValueError) as exc:
            raise self._connection_error(
                f"cannot open a NETCONF session on {s.host}:{s.port}: {exc!r}",
                "check that the switch is on and that host/port name its NETCONF server (SSH subsystem "
                "'netconf', port 830 by default); raise timeout_ms if the network is slow",
                exc,
            ) from exc
        caps = [str(c) for c in m.server_capabilities]
        self.revision = _revision(caps)
        self.motion = any(c.startswith(MOTION_NS) for c in caps)
        framing = "1.1" if "urn:ietf:params:netconf:base:1.1" in caps else "1.0"
        record(
            self.audit,
            self.device,
            self.address,
            "rx",
            f"(NETCONF session {m.session_id} opened, base:{framing} framing; server capabilities: {' '.join(caps)})",
        )
        return m

    def _known_host_key(self, known_hosts: str, name: str, keyscan: str) -> paramiko.PKey:
        try:
            keys = paramiko.HostKeys(known_hosts)
        except FileNotFoundError:
            keys = paramiko.HostKeys()
        except (OSError, paramiko.SSHException) as exc:
            raise self._connection_error(
                f"cannot read the known_hosts file {known_hosts}: {exc}",
                "set known_hosts in the inventory's netconf transport to a readable OpenSSH known_hosts file",
                exc,
            ) from exc
        entry = keys.lookup(name) or {}
        for kind in (*HOST_KEY_ORDER, *entry.keys()):
            if kind in entry:
                return entry[kind]
        raise self._connection_error(
            f"the host key of {name} is not in {known_hosts}; refusing to connect to an unknown host",
            f"verify the switch's key fingerprint out of band, then add it: `{keyscan}` (or set known_hosts in the "
            "inventory's netconf transport); keys are never accepted automatically",
        )

    def _connection_error(self, message: str, hint: str, exc: BaseException | None = None) -> DeviceConnectionError:
        if exc is not None:
            record(self.audit, self.device, self.address, "rx", f"(connection failed: {exc!r})")
        return DeviceConnectionError(message, device=self.device, address=self.address, hint=hint)

    def _rpc(self, op: str, what: str, *, check: bool = True) -> _Reply | None:
        """Send one RPC; the exchange, or None for a refusal kept for check_errors (check=False). Held deletes
        go first, so the switch sees the calls in the order they were made.
        """
        with self._lock:
            self._flush()
            reply = self._execute(self._manager(), op)
            errors = reply.root.findall(_q(NC_NS, "rpc-error"))
            if errors:
                error = self._command_error(what, reply, errors)
                if check:
                    raise error
                self._deferred.append(error)
                return None
            return reply

    def _execute(self, m, op: str, *, close: bool = False) -> _Reply:
        sent: list[str] = []

        def on_sent(xml: str) -> None:
            sent.append(xml)
            record(self.audit, self.device, self.address, "tx", xml)

        try:
            reply = m.execute(_AuditedRpc, to_ele(op), on_sent, close)
        except TimeoutExpiredError as exc:
            record(self.audit, self.device, self.address, "rx", "(timeout)")
            self._drop()
            raise self._error(
                DeviceTimeout,
                f"no reply within {self.settings.timeout_s:g} s",
                sent=sent[0] if sent else op,
                hint="the switch may be busy or the network slow: raise timeout_ms; whether a change took effect "
                "is unknown until connections() is read",
            ) from exc
        except CONNECTION_LOST as exc:
            record(self.audit, self.device, self.address, "rx", f"(connection lost: {exc!r})")
            self._drop()
            raise self._error(
                DeviceConnectionError,
                f"the NETCONF session was lost: {exc!r}",
                sent=sent[0] if sent else op,
                hint="the switch restarted or the network dropped; the next call opens a new session",
            ) from exc
        raw = reply.xml
        record(self.audit, self.device, self.address, "rx", raw)
        try:
            root = SafeET.fromstring(raw.encode(), forbid_dtd=True)
        except (DefusedXmlException, ET.ParseError, ValueError) as exc:
            raise self._error(
                DeviceProtocolError,
                f"unreadable reply: {exc}",
                sent=sent[0] if sent else op,
                received=raw,
                hint="the reply is not plain XML (a DTD or entities are refused); is this a NETCONF server?",
            ) from None
        return _Reply(sent[0] if sent else op, raw, root)

    def _drop(self) -> None:
        m, self._m = self._m, None
        if m is not None:
            try:
                m._session.close()  # ncclient has no public way to drop a session without sending an RPC
            except Exception:  # already broken: only its thread and socket are freed here
                pass

    def _command_error(self, what: str, reply: _Reply, errors: list[ET.Element]) -> DeviceCommandError:
        first = errors[0]
        tag = _text(first.find(_q(NC_NS, "error-tag")))
        message = _text(first.find(_q(NC_NS, "error-message")))
        info = first.find(_q(NC_NS, "error-info"))
        details = {c.tag.rpartition("}")[2]: _text(c) for c in ([] if info is None else info)}
        path = _text(first.find(_q(NC_NS, "error-path")))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return self._error(
            DeviceCommandError,
            f"the switch refused {what}: {tag}: {message}{more}",
            sent=reply.sent,
            received=reply.raw,
            hint=self._hint_for(tag, details, path),
        )

    def _hint_for(self, tag: str, info: dict[str, str], path: str = "") -> str:
        if tag in ("invalid-value", "bad-element"):
            return self._port_hint()
        if tag == "in-use":
            return self._in_use_hint(info, path)
        if tag == "lock-denied":
            return _lock_hint(info.get("session-id"))
        if tag == "data-missing":
            return "that circuit is not on the switch (read connections()); another client may have changed it"
        if tag == "data-exists":
            return "the circuit already exists; read connections()"
        if tag in ("unknown-element", "unknown-namespace", "missing-element", "bad-attribute", "missing-attribute"):
            return (
                f"the switch's optical-switch YANG (revision {self.revision or 'unknown'}) does not take this request; "
                "check its firmware against the driver (docs/protocols.md §7)"
            )
        if tag == "operation-not-supported":
            return "the switch does not support this operation; check its firmware and NETCONF capabilities"
        if tag == "too-big":
            return "the request is too large for the switch: change fewer circuits per call"
        return "see the switch's error message; nothing was changed by a refused edit-config"

    def _in_use_hint(self, info: dict[str, str], path: str) -> str:
        """in-use says a port carries a circuit, or that running is locked (RFC 6241 §7.5, Appendix A: then with
        no error-info, so no session-id). Only an error that points at a pair or a port gets the circuit hint;
        one that names no port is a lock unless the switch shows otherwise: docs/protocols.md §7.10.
        """
        if "session-id" in info:
            return _lock_hint(info["session-id"])
        if info.get("bad-element") in ("ingress", "egress", "pair", "pairs") or "cross-connects" in path:
            return "an egress port carries one circuit at a time: disconnect the circuit that holds it first"
        holder = self._lock_holder()
        if holder is not None:
            return _lock_hint(holder)
        return (
            "the switch says something is in use but names no port and no session, and running was not locked when "
            "the driver checked (a lock may have ended since): read connections(), then retry"
        )

    def _lock_holder(self) -> str | None:
        """Who holds the lock on running, asked the only way NETCONF's base offers: a <lock>, which is refused
        with lock-denied naming the holder's session-id (RFC 6241 Appendix A; 0: not a NETCONF session). If it is
        granted instead, running was not locked: it is released at once. None: not locked, or no answer.
        """
        try:
            reply = self._execute(self._m, f'<lock xmlns="{NC_NS}"><target><running/></target></lock>')
            error = reply.root.find(_q(NC_NS, "rpc-error"))
            if error is None:
                self._execute(self._m, f'<unlock xmlns="{NC_NS}"><target><running/></target></unlock>')
                return None
            if _text(error.find(_q(NC_NS, "error-tag"))) != "lock-denied":
                return None
            info = error.find(_q(NC_NS, "error-info"))
            ids = [_text(c) for c in ([] if info is None else info) if c.tag.rpartition("}")[2] == "session-id"]
            return ids[0] if ids and ids[0] else "?"
        except (DeviceError, AttributeError):  # the session is gone (the error says so): no holder to name
            return None

    def _port_hint(self) -> str:
        return switch_ports_hint(self._size, self.size) or (
            "a port number is outside the switch; its product-information gives its NxM size"
        )

    def _error(self, cls: type[DeviceError], message: str, **kw) -> DeviceError:
        """A device error of this switch: `kw` says what was sent and received, and what to try."""
        return cls(message, device=self.device, address=self.address, **kw)

    def _protocol(self, reply: _Reply, expected: str) -> DeviceProtocolError:
        return self._error(
            DeviceProtocolError,
            f"unexpected reply: expected {expected}",
            sent=reply.sent,
            received=reply.raw,
            hint="is this a Polatis switch with the optical-switch YANG module? (see its hello capabilities)",
        )


def _lock_hint(session_id: str | None) -> str:
    if session_id == "0":
        holder = "someone outside NETCONF (the switch's CLI, TL1 or web interface)"
    elif session_id and session_id != "?":
        holder = f"NETCONF session {session_id}"
    else:
        holder = "another NETCONF session (the switch did not say which)"
    return f"running is locked by {holder}: wait for it to unlock, or end that session, then retry"


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
