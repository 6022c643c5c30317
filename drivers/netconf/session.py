"""One switch's NETCONF session over SSH on ncclient: opened with the host key checked, opened again after a drop,
every RPC audited as the exact XML sent and received, replies re-read with defusedxml (no DTDs, no entities).

Host keys are checked against the known_hosts file with ncclient's own options: the key listed for `[host]:port`
is handed to `manager.connect(hostkey_b64=...)` with `hostkey_verify=True`, so the server must present exactly
that key; a host missing from the file is refused before any connection is made.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import defusedxml.ElementTree as SafeET
import paramiko
from defusedxml import DefusedXmlException
from ncclient import manager
from ncclient.manager import Manager
from ncclient.operations.errors import TimeoutExpiredError
from ncclient.operations.rpc import RPC, RaiseMode
from ncclient.transport import session as _nc_session
from ncclient.transport.errors import AuthenticationError, SSHUnknownHostError, TransportError
from ncclient.transport.errors import SessionError as NcSessionError
from ncclient.xml_ import to_ele

from drivers.audit import AuditSink, record
from drivers.errors import DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.netconf.settings import NetconfSettings

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
HOST_KEY_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
CONNECTION_LOST = (TransportError, NcSessionError, OSError, EOFError, paramiko.SSHException)
E = TypeVar("E", bound=DeviceError)

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
        """Send `op` and wait for its reply (close=True: then close the session, as close-session does)."""
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
class Reply:
    """One exchange: the <rpc> as sent, the <rpc-reply> as received, and the reply parsed."""

    sent: str
    raw: str
    root: ET.Element

    @property
    def data(self) -> ET.Element:
        """The reply's <data>, empty if it has none."""
        found = self.root.find(qname(NC_NS, "data"))
        return ET.Element(qname(NC_NS, "data")) if found is None else found


def qname(ns: str, name: str) -> str:
    """The ElementTree name of `name` in namespace `ns`."""
    return f"{{{ns}}}{name}"


def text_of(elem: ET.Element | None) -> str:
    """An element's text, stripped; "" for no element."""
    return "" if elem is None else (elem.text or "").strip()


class NetconfSession:
    """The NETCONF session with one switch: opened on demand, dropped when it breaks, closed with close-session.

    Not locked: its one user (the driver) calls it under its own lock.
    """

    def __init__(self, settings: NetconfSettings, device: str, audit: AuditSink | None) -> None:
        self.settings = settings
        self.device = device
        self.audit = audit
        self.address = settings.address
        self.capabilities: list[str] = []  # what the server's hello announced (the last session opened)
        self._m: Manager | None = None

    def manager(self) -> Manager:
        """The open NETCONF session, opened (again) if there is none."""
        if self._m is None or not self._m.connected:
            self._m = None
            self._m = self._connect()
        return self._m

    def close(self) -> None:
        """End the session with a close-session, if one is open; errors are ignored (closing anyway)."""
        m, self._m = self._m, None
        if m is not None and m.connected:
            try:
                self.execute(m, f'<close-session xmlns="{NC_NS}"/>', close=True)
            except (DeviceError, *CONNECTION_LOST):
                pass  # closing anyway

    def execute(self, m: Manager, op: str, *, close: bool = False) -> Reply:
        """Send one RPC on the session `m` and read its reply (close=True: then close the session); audited.
        Raises DeviceTimeout or DeviceConnectionError (and drops the session), or DeviceProtocolError.
        """
        sent: list[str] = []

        def on_sent(xml: str) -> None:
            sent.append(xml)
            record(self.audit, self.device, self.address, "tx", xml)

        try:
            reply = m.execute(_AuditedRpc, to_ele(op), on_sent, close)
        except TimeoutExpiredError as exc:
            record(self.audit, self.device, self.address, "rx", "(timeout)")
            self.drop()
            raise self.error(
                DeviceTimeout,
                f"no reply within {self.settings.timeout_s:g} s",
                sent=sent[0] if sent else op,
                hint="the switch may be busy or the network slow: raise timeout_ms; whether a change took effect "
                "is unknown until connections() is read",
            ) from exc
        except CONNECTION_LOST as exc:
            record(self.audit, self.device, self.address, "rx", f"(connection lost: {exc!r})")
            self.drop()
            raise self.error(
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
            raise self.error(
                DeviceProtocolError,
                f"unreadable reply: {exc}",
                sent=sent[0] if sent else op,
                received=raw,
                hint="the reply is not plain XML (a DTD or entities are refused); is this a NETCONF server?",
            ) from None
        return Reply(sent[0] if sent else op, raw, root)

    def drop(self) -> None:
        """Forget the session without a close-session (after a timeout or a lost connection)."""
        m, self._m = self._m, None
        if m is not None:
            try:
                m._session.close()  # ncclient has no public way to drop a session without sending an RPC
            except Exception:  # already broken: only its thread and socket are freed here
                pass

    def lock_holder(self) -> str | None:
        """Who holds the lock on running, asked the only way NETCONF's base offers: a <lock>, which is refused
        with lock-denied naming the holder's session-id (RFC 6241 Appendix A; 0: not a NETCONF session). If it is
        granted instead, running was not locked: it is released at once. None: not locked, or no answer.
        """
        m = self._m
        if m is None:
            return None
        try:
            reply = self.execute(m, f'<lock xmlns="{NC_NS}"><target><running/></target></lock>')
            error = reply.root.find(qname(NC_NS, "rpc-error"))
            if error is None:
                self.execute(m, f'<unlock xmlns="{NC_NS}"><target><running/></target></unlock>')
                return None
            if text_of(error.find(qname(NC_NS, "error-tag"))) != "lock-denied":
                return None
            info = error.find(qname(NC_NS, "error-info"))
            ids = [text_of(c) for c in ([] if info is None else info) if c.tag.rpartition("}")[2] == "session-id"]
            return ids[0] if ids and ids[0] else "?"
        except (DeviceError, AttributeError):  # the session is gone (the error says so): no holder to name
            return None

    def error(self, cls: type[E], message: str, **kw: Any) -> E:
        """A device error of this switch: `kw` says what was sent and received, and what to try."""
        return cls(message, device=self.device, address=self.address, **kw)

    def _connect(self) -> Manager:
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
        self.capabilities = caps
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
        entry: Mapping[str, paramiko.PKey] = keys.lookup(name) or {}
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
