"""A host's power through its BMC: Redfish (the DMTF standard) over HTTPS, with DMTF's own client library
(`redfish`, python-redfish-library).

What it does, in the library's calls:

    client = redfish.redfish_client(base_url=..., username=..., password=..., cafile=..., timeout=..., max_retry=0)
    client.login(auth="session")                      # POST SessionService/Sessions -> X-Auth-Token
                                                      # (or auth="basic": the BMC has no SessionService)
    client.get("/redfish/v1/Systems/1")               # ComputerSystem: PowerState, the Reset action's target
    client.post(".../Actions/ComputerSystem.Reset", body={"ResetType": "ForceOff"})
    client.logout()                                   # DELETE the session

`power_off()` / `power_on()` reset and then read PowerState back until it is what was asked (at most
`power_wait_s`), because a BMC accepts a reset before the host has followed it. A power call skips the reset
when the host is already in that state (several BMCs refuse a ForceOff of a host that is off with 409).

The login follows the service root (the Redfish standard allows both): a session (X-Auth-Token) when the root
links a SessionService, as most BMCs do; HTTP Basic on each request when it does not (OpenStack's
sushy-emulator, some older BMCs). Either way the password goes only over https: a plain-http address is
refused before anything is sent.

TLS is always verified, hostname included: against `ca_file` when the inventory names one (the CA that signed
the BMC's certificate, or that certificate itself, pinned, whoever issued it: drivers.redfish.http's
`verifying_context`), else against the CA bundle `requests` ships. The library
turns verification off when it is given no CA file, so one is always given. `max_retry=0`: the library would
otherwise retry a failed request ten times a second apart (a Reset included), which hides a dead BMC for
ten seconds and can send a reset twice. The library's requests go through drivers.redfish.http's adapter: no
redirect to another origin or to plain HTTP (the session token would follow it), one deadline per request
(`timeout_s`, the whole request, not each read), at most 16 MiB of body.

Every request is audited (method, path, body; status and body back) except credentials: a login is
recorded as the user logging in, never the password, and session tokens are never recorded.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from drivers.audit import AuditSink, record
from drivers.errors import DeviceCommandError, DeviceConnectionError, DeviceError, DeviceProtocolError, DeviceTimeout
from drivers.redfish.http import BodyTooLarge, DeadlineExceeded, GuardedAdapter, RedirectRefused

ROOT = "/redfish/v1"


@dataclass(frozen=True)
class RedfishSettings:
    """How to reach one host's BMC. `password` is never shown (repr) and never recorded."""

    address: str  # https://HOST[:PORT]
    user: str
    password: str | None = field(default=None, repr=False)
    password_env: str | None = None  # the variable it came from: errors say what to set
    system: str | None = None  # the ComputerSystem's Id; None: the only (or first) member of Systems
    ca_file: str | None = None
    timeout_s: float = 10.0
    power_wait_s: float = 60.0
    poll_s: float = 0.2

    @classmethod
    def from_dict(cls, data: dict) -> RedfishSettings:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


class RedfishBmc:
    """One BMC session (opened on first use, closed by `close`). `device` is the host the BMC powers: every
    error names it, with the BMC's address.
    """

    def __init__(self, settings: RedfishSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self.audit = audit
        self._client: Any = None
        self.auth: str | None = None  # "session" or "basic", from the service root at login (`_connect`)
        self._system: dict | None = None  # {"path", "reset", "allowed"}

    # --- power --------------------------------------------------------------------------------------------

    def power_state(self) -> str:
        """The system's PowerState: "On", "Off", "PoweringOn", "PoweringOff" (or what the BMC says)."""
        body = self._get(self._system_info()["path"], "read the host's power state")
        state = body.get("PowerState")
        if not isinstance(state, str):
            raise self._error(
                DeviceProtocolError,
                "the BMC's ComputerSystem has no PowerState",
                sent=f"GET {self._system_info()['path']}",
                received=_clip(json.dumps(body)),
                hint="this BMC does not report power through Redfish; power the host with its vendor's tools",
            )
        return state

    def reset(self, kind: str) -> tuple[int, int]:
        """POST ComputerSystem.Reset with ResetType `kind`; returns the monotonic ns just before the request
        went out and just after its answer came back (the reset happened in between).
        """
        system = self._system_info()
        allowed = system["allowed"]
        if allowed is not None and kind not in allowed:
            raise self._error(
                DeviceCommandError,
                f"the BMC does not offer ResetType {kind!r}",
                sent=f"(nothing: {system['reset']} allows {', '.join(allowed)})",
                hint="this BMC cannot do that reset through Redfish; use one it lists, or the vendor's tools",
            )
        body = {"ResetType": kind}
        resp, t0, t1 = self._request("POST", system["reset"], body)
        if resp.status not in (200, 202, 204):
            raise self._http_error(resp, f"POST {system['reset']} {json.dumps(body)}", f"ComputerSystem.Reset {kind}")
        return t0, t1

    def power_off(self) -> dict:
        """ForceOff, then wait until PowerState reads Off."""
        return self._power("ForceOff", "Off")

    def power_on(self) -> dict:
        """On, then wait until PowerState reads On."""
        return self._power("On", "On")

    def _power(self, kind: str, want: str) -> dict:
        before = self.power_state()
        if before == want:
            return {"reset": None, "power_state": before, "changed": False, "reset_ns": None, "waited_s": 0.0}
        t0, t1 = self.reset(kind)
        state = self._wait_for(want, kind, t1)
        return {
            "reset": kind,
            "power_state": state,
            "changed": True,
            "reset_ns": (t0 + t1) // 2,
            "waited_s": round((time.monotonic_ns() - t1) / 1e9, 3),
        }

    def _wait_for(self, want: str, kind: str, since_ns: int) -> str:
        deadline = since_ns + int(self.settings.power_wait_s * 1e9)
        while True:
            state = self.power_state()
            if state == want:
                return state
            if time.monotonic_ns() >= deadline:
                raise self._error(
                    DeviceTimeout,
                    f"PowerState is still {state!r} {self.settings.power_wait_s:g} s after ComputerSystem.Reset "
                    f"{kind} was accepted",
                    sent=f"POST {self._system_info()['reset']} {json.dumps({'ResetType': kind})}",
                    received=f"PowerState {state!r}",
                    hint="the BMC took the reset but the host did not follow: look at the BMC's event log; if the "
                    "host is only slow to change, raise bmc.power_wait_ms in the inventory",
                )
            time.sleep(self.settings.poll_s)  # polling the BMC: Redfish has no wait-for-state call

    # --- the session ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Log out (a BMC has few session slots; one left open holds a slot until it times out)."""
        client, self._client = self._client, None
        if client is None:
            return
        where = _path_of(client.get_session_location() or "")
        try:
            if where:
                record(self.audit, self.device, self.address, "tx", f"DELETE {where} (log out)")
            client.logout()
            if where:
                record(self.audit, self.device, self.address, "rx", "logged out")
        except Exception as exc:  # the BMC went away, or already dropped the session: nothing to free
            record(self.audit, self.device, self.address, "rx", f"(log out failed: {type(exc).__name__})")

    def __enter__(self) -> RedfishBmc:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        import redfish
        from redfish.rest.v1 import (
            JsonDecodingError,
            RetriesExhaustedError,
            ServerDownOrUnreachableError,
        )

        s = self.settings
        if s.password is None:
            raise self._error(
                DeviceConnectionError,
                "no password for the BMC",
                hint=f"export {s.password_env}=... in the shell that runs testbed"
                if s.password_env
                else "give the driver the BMC password",
            )
        if urlparse(self.address).scheme.lower() != "https":
            # A session login carries the password in its body, HTTP Basic in every request's header: neither goes
            # over plain HTTP (the Redfish standard requires TLS for both). Nothing is sent.
            raise self._error(
                DeviceConnectionError,
                f"the BMC's address {self.address} is plain http: the BMC's password (a session login or HTTP Basic) "
                "is sent only over https",
                sent="(nothing)",
                hint="set bmc.address to the BMC's https address (https://HOST[:PORT]); every Redfish BMC serves "
                "https, and its certificate is verified against bmc.ca_file",
            )
        ca = self._ca_file()
        sent = f"GET {ROOT}/"
        adapter = self._adapter(ca, sent)
        record(self.audit, self.device, self.address, "tx", sent)
        try:
            client = redfish.redfish_client(
                base_url=self.address,
                username=s.user,
                password=s.password,
                cafile=ca,
                timeout=s.timeout_s,
                max_retry=0,
                https_adapter=adapter,
            )
        except RetriesExhaustedError as exc:
            raise self._transport_error(exc, sent, ca) from None
        except ServerDownOrUnreachableError as exc:
            response = getattr(exc, "response", None)
            if response is not None:
                raise self._http_error(response, sent, "read the service root") from None
            raise self._error(
                DeviceConnectionError,
                "the BMC is unreachable",
                sent=sent,
                received=str(exc),
                hint="check bmc.address in the inventory and that the BMC is up",
            ) from None
        except JsonDecodingError as exc:
            raise self._error(
                DeviceProtocolError,
                "the service root is not JSON: this is not a Redfish service",
                sent=sent,
                received=str(exc),
                hint="check bmc.address: it must be the BMC's HTTPS address, where /redfish/v1 is served",
            ) from None
        root = getattr(client, "root", None)
        record(self.audit, self.device, self.address, "rx", f"200 {_clip(json.dumps(root))}")
        if not isinstance(root, dict):
            raise self._error(
                DeviceProtocolError,
                "the service root is not a JSON object: this is not a Redfish service",
                sent=sent,
                received=_clip(json.dumps(root)),
                hint="check bmc.address: it must be the BMC's HTTPS address, where /redfish/v1 is served",
            )
        self.auth = "session" if _has_session_service(root) else "basic"
        if self.auth == "session":
            self._session_login(client, ca)
        else:
            self._basic_login(client, root, ca)
        self._client = client
        return client

    def _adapter(self, ca: str, sent: str) -> GuardedAdapter:
        try:
            return GuardedAdapter(self.address, self.settings.timeout_s, ca)
        except (OSError, ssl.SSLError) as exc:  # not PEM, no certificate in it, unreadable
            raise self._error(
                DeviceConnectionError,
                f"could not use the CA file {ca} to verify the BMC",
                sent=f"(nothing: {sent} needs it)",
                received=str(exc),
                hint="set bmc.ca_file to a readable PEM file holding the CA that signed the BMC's certificate, or "
                "the BMC's certificate itself",
            ) from None

    def _session_login(self, client: Any, ca: str) -> None:
        """POST the service root's Links.Sessions: the BMC has a SessionService."""
        from redfish.messages import RedfishPasswordChangeRequiredError
        from redfish.rest.v1 import InvalidCredentialsError, RetriesExhaustedError, SessionCreationError

        s = self.settings
        login = f"POST {client.login_url} (session login as {s.user!r})"
        record(self.audit, self.device, self.address, "tx", login)
        try:
            client.login(auth="session")
        except InvalidCredentialsError:
            record(self.audit, self.device, self.address, "rx", "401 (login refused)")
            raise self._refused(login) from None
        except RedfishPasswordChangeRequiredError:
            record(self.audit, self.device, self.address, "rx", "(password change required)")
            raise self._error(
                DeviceCommandError,
                f"the BMC wants the password of user {s.user!r} changed before it accepts a login",
                sent=login,
                received="Base.PasswordChangeRequired",
                hint="log in to the BMC once by hand, set a new password, and put it in "
                + (f"${s.password_env}" if s.password_env else "the settings"),
            ) from None
        except SessionCreationError as exc:
            record(self.audit, self.device, self.address, "rx", f"(login failed: {exc})")
            raise self._error(
                DeviceCommandError,
                "the BMC did not open a session",
                sent=login,
                received=str(exc),
                hint=_session_hint(str(exc)),
            ) from None
        except RetriesExhaustedError as exc:
            raise self._transport_error(exc, login, ca) from None
        record(self.audit, self.device, self.address, "rx", "session opened")

    def _basic_login(self, client: Any, root: dict, ca: str) -> None:
        """HTTP Basic on every request (the BMC has no SessionService; the address is https, checked above). The
        credentials are tried on the Systems collection, which needs them and is read next anyway.
        """
        from redfish.rest.v1 import InvalidCredentialsError, RetriesExhaustedError

        systems = _link(root, "Systems") or f"{ROOT}/Systems"
        client.login_url = systems  # where the library's basic login checks the credentials (a GET)
        login = f"GET {systems} (HTTP Basic as {self.settings.user!r}: the BMC has no SessionService)"
        record(self.audit, self.device, self.address, "tx", login)
        try:
            client.login(auth="basic")
        except InvalidCredentialsError:
            record(self.audit, self.device, self.address, "rx", "401 (login refused)")
            raise self._refused(login) from None
        except RetriesExhaustedError as exc:
            raise self._transport_error(exc, login, ca) from None
        record(self.audit, self.device, self.address, "rx", "credentials accepted")

    def _refused(self, login: str) -> DeviceError:
        s = self.settings
        return self._error(
            DeviceCommandError,
            f"the BMC refused the login of user {s.user!r}",
            sent=login,
            received="HTTP 401 Unauthorized",
            hint=f"check bmc.user in the inventory and the password in ${s.password_env}"
            if s.password_env
            else "check the user and the password",
        )

    def _ca_file(self) -> str:
        ca = self.settings.ca_file
        if ca is None:
            import requests.certs

            return requests.certs.where()  # what requests verifies against by default
        if not os.path.isfile(ca):
            raise self._error(
                DeviceConnectionError,
                f"the BMC's CA file (bmc.ca_file) {ca} does not exist",
                hint="set bmc.ca_file to the PEM file of the CA that signed the BMC's certificate (or of the "
                "certificate itself); verification is never turned off",
            )
        return ca

    # --- requests -----------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[Any, int, int]:
        """One request on the session; logs in again once if the BMC dropped the session (401)."""
        from redfish.rest.v1 import RetriesExhaustedError

        sent = f"{method} {path}" + (f" {json.dumps(body)}" if body is not None else "")
        for attempt in (1, 2):
            client = self._connect()
            t0 = record(self.audit, self.device, self.address, "tx", sent)
            try:
                if method == "GET":
                    resp = client.get(path)
                else:
                    resp = client.post(path, body=body)
            except RetriesExhaustedError as exc:
                self._drop()
                raise self._transport_error(exc, sent, self.settings.ca_file) from None
            t1 = record(self.audit, self.device, self.address, "rx", f"{resp.status} {_clip(_text(resp))}")
            if resp.status == 401 and attempt == 1 and self.auth == "session":
                self._drop()  # the session timed out or the BMC restarted: a 401 means nothing was done
                continue
            return resp, t0, t1
        return resp, t0, t1

    def _get(self, path: str, what: str) -> dict:
        resp, _, _ = self._request("GET", path)
        if resp.status != 200:
            raise self._http_error(resp, f"GET {path}", what)
        body = _json_of(resp)
        if not isinstance(body, dict):
            raise self._error(
                DeviceProtocolError,
                f"the BMC's {path} is not a JSON object",
                sent=f"GET {path}",
                received=_clip(_text(resp)),
                hint="check bmc.address: it must be the BMC's Redfish service",
            )
        return body

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client._session.close()  # the library's requests session: its connections, not the BMC's session
            except Exception:
                pass

    def _system_info(self) -> dict:
        """The ComputerSystem this BMC powers: its path, its Reset action's target and allowed ResetTypes."""
        if self._system is not None:
            return self._system
        client = self._connect()
        systems = _link(getattr(client, "root", None), "Systems") or f"{ROOT}/Systems"
        collection = self._get(systems, "list the BMC's systems")
        members = [_path_of(m.get("@odata.id", "")) for m in collection.get("Members") or [] if isinstance(m, dict)]
        members = [m for m in members if m]
        wanted = self.settings.system
        if wanted is None:
            if not members:
                raise self._error(
                    DeviceCommandError,
                    "the BMC lists no system in its Systems collection",
                    sent=f"GET {systems}",
                    received=_clip(json.dumps(collection)),
                    hint="this BMC powers nothing through Redfish; check bmc.address",
                )
            path = members[0]
        else:
            path = next((m for m in members if m.rstrip("/").rsplit("/", 1)[-1] == wanted), None)
            if path is None:
                ids = ", ".join(m.rstrip("/").rsplit("/", 1)[-1] for m in members) or "none"
                raise self._error(
                    DeviceCommandError,
                    f"the BMC has no system {wanted!r}",
                    sent=f"GET {systems}",
                    received=f"members: {ids}",
                    hint=f"set bmc.system to one of: {ids} (or leave it out to use the first)",
                )
        system = self._get(path, "read the ComputerSystem")
        action = (system.get("Actions") or {}).get("#ComputerSystem.Reset") or {}
        target = _path_of(action.get("target") or "") or f"{path}/Actions/ComputerSystem.Reset"
        allowed = action.get("ResetType@Redfish.AllowableValues")
        self._system = {
            "path": path,
            "reset": target,
            "allowed": [a for a in allowed if isinstance(a, str)] if isinstance(allowed, list) else None,
        }
        return self._system

    # --- errors -------------------------------------------------------------------------------------------

    def _error(self, cls: type[DeviceError], message: str, **kw) -> DeviceError:
        return cls(message, device=self.device, address=self.address, **kw)

    def _http_error(self, resp: Any, sent: str, what: str) -> DeviceError:
        """A request the BMC answered with an error: its status and its Redfish messages (MessageId, Message),
        and what to change (the BMC's Resolution if it gave one).
        """
        messages, resolutions = _extended_info(resp)
        received = f"HTTP {resp.status}" + (": " + " | ".join(messages) if messages else f": {_clip(_text(resp))}")
        if resolutions:
            hint = " ".join(dict.fromkeys(resolutions))
        elif resp.status in (401, 403):
            env = self.settings.password_env
            hint = (
                f"check bmc.user and the password in ${env}, and that user {self.settings.user!r} may "
                "reset the system on the BMC (its role needs ConfigureComponents)"
                if env
                else "check the user, the password and the user's role on the BMC"
            )
        elif resp.status == 404:
            hint = "check bmc.address and bmc.system in the inventory"
        elif resp.status >= 500:
            hint = "the BMC failed: try again; if it persists, reset the BMC (not the host) from its own interface"
        else:
            hint = "read the BMC's message above; the request is what the Redfish standard specifies"
        cls = DeviceProtocolError if resp.status >= 500 else DeviceCommandError
        return self._error(
            cls, f"the BMC answered HTTP {resp.status} ({what})", sent=sent, received=received, hint=hint
        )

    def _transport_error(self, exc: Exception, sent: str, ca: str | None) -> DeviceError:
        import requests

        cause = exc.__cause__ or exc
        if isinstance(cause, RedirectRefused):
            return self._error(
                DeviceProtocolError,
                f"the BMC redirected the request to {cause.target}, another origin or plain HTTP: not followed, and "
                "the session's token was not sent there",
                sent=sent,
                received=f"a redirect to {cause.target}",
                hint="set bmc.address to the BMC's own https address (the one it redirects to, if that is the BMC), "
                "or check who answers at this address",
            )
        if isinstance(cause, DeadlineExceeded):
            return self._error(
                DeviceTimeout,
                f"no whole answer within {cause.seconds:g} s (the BMC answered too slowly, or not at all)",
                sent=sent,
                received="the connection was shut at the deadline",
                hint="raise bmc.timeout_ms for a slow BMC; a BMC that answers a byte at a time is not well",
            )
        if isinstance(cause, BodyTooLarge):
            return self._error(
                DeviceProtocolError,
                f"the BMC's answer is larger than {cause.limit} bytes, far more than a Redfish resource",
                sent=sent,
                received=f"more than {cause.limit} bytes (not read further)",
                hint="check bmc.address: it must be the BMC's Redfish service",
            )
        if _timed_out(cause):
            return self._error(
                DeviceTimeout,
                f"no answer within {self.settings.timeout_s:g} s",
                sent=sent,
                received=_reason(cause),
                hint="check that bmc.address is the BMC's (its management network is reachable from this "
                "machine); raise bmc.timeout_ms for a slow BMC",
            )
        if isinstance(cause, requests.exceptions.SSLError):
            against = (
                f"bmc.ca_file {self.settings.ca_file}" if self.settings.ca_file else "the default CA bundle (certifi's)"
            )
            return self._error(
                DeviceConnectionError,
                f"the BMC's TLS certificate did not verify against {against}",
                sent=sent,
                received=_reason(cause),
                hint="set bmc.ca_file in the inventory to the PEM file of the CA that signed the BMC's certificate "
                "(or of the certificate itself, to pin it); verification is never turned off",
            )
        if isinstance(cause, OSError) and not isinstance(cause, requests.exceptions.RequestException):
            return self._error(
                DeviceConnectionError,
                f"could not use the CA file {ca} to verify the BMC",
                sent=sent,
                received=str(cause),
                hint="set bmc.ca_file to a readable PEM file",
            )
        return self._error(
            DeviceConnectionError,
            "could not reach the BMC",
            sent=sent,
            received=_reason(cause),
            hint="check bmc.address in the inventory (https://HOST[:PORT]) and that this machine reaches the "
            "BMC's management network",
        )


def _link(resource: Any, *keys: str) -> str:
    """The path a resource links under `keys` ({"Systems": {"@odata.id": PATH}}), or "" if it links none there
    (whatever else a BMC put in its place).
    """
    for key in keys:
        resource = resource.get(key) if isinstance(resource, dict) else None
    link = resource.get("@odata.id") if isinstance(resource, dict) else None
    return _path_of(link) if isinstance(link, str) else ""


def _has_session_service(root: dict) -> bool:
    """Whether the service root links a SessionService (or, as the standard requires beside it, Links.Sessions):
    then the driver logs in with a session; without one, HTTP Basic is the standard's other way in.
    """
    return bool(_link(root, "SessionService") or _link(root, "Links", "Sessions"))


def _session_hint(failure: str) -> str:
    """What to change when a BMC that has a SessionService did not open a session (the library's text: "HTTP
    STATUS: Failed to create the session\nMESSAGE").
    """
    status = failure.split(":", 1)[0].removeprefix("HTTP ").strip()
    if status == "503" or "SessionLimitExceeded" in failure or "session limit" in failure.lower():
        return (
            "the BMC has no free session slot: log out other clients (or wait for their sessions to time out) "
            "and try again"
        )
    if status in ("404", "405", "501"):
        return (
            "the BMC lists a SessionService but does not take a session login at that address: enable its session "
            "service in the BMC's own settings, or check bmc.address"
        )
    if status == "403":
        return "the user may not log in over Redfish: give it a role with the Login privilege on the BMC"
    if status.startswith("5"):
        return "the BMC failed: try again; if it persists, reset the BMC (not the host) from its own interface"
    return "read the BMC's message above; the login is the one the Redfish standard specifies"


def _timed_out(exc: BaseException) -> bool:
    """Whether a read or a connection timed out, wherever requests put it (a body read that times out is raised as
    a ConnectionError around urllib3's ReadTimeoutError).
    """
    import socket

    import requests
    from urllib3.exceptions import NewConnectionError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NewConnectionError):  # a refused connection (urllib3 files it under connect timeouts)
            return False
        if isinstance(exc, requests.exceptions.Timeout | Urllib3Timeout | socket.timeout):
            return True
        nested = exc.__cause__ or exc.__context__ or (exc.args[0] if exc.args else None)
        exc = nested if isinstance(nested, BaseException) else None
    return False


def _extended_info(resp: Any) -> tuple[list[str], list[str]]:
    body = _json_of(resp)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return [], []
    infos = err.get("@Message.ExtendedInfo")
    messages, resolutions = [], []
    for info in infos if isinstance(infos, list) else []:
        if isinstance(info, dict):
            messages.append(f"{info.get('MessageId', '?')}: {info.get('Message', '')}".strip())
            if isinstance(info.get("Resolution"), str) and info["Resolution"] not in ("", "None", "None."):
                resolutions.append(info["Resolution"])
    if not messages and isinstance(err.get("message"), str):
        messages.append(f"{err.get('code', '?')}: {err['message']}")
    return messages, resolutions


def _json_of(resp: Any) -> Any:
    try:
        return json.loads(_text(resp)) if _text(resp).strip() else None
    except ValueError:
        return None


def _text(resp: Any) -> str:
    try:
        return resp.text
    except Exception:  # a body that is not text
        return ""


def _path_of(link: str) -> str:
    """A resource's path from its @odata.id (a path, or now and then a full URL)."""
    if not isinstance(link, str):
        return ""
    return urlparse(link).path if "://" in link else link


def _reason(exc: BaseException) -> str:
    """The innermost cause's text: what urllib3 and ssl said, without requests' wrapping."""
    while exc.__cause__ is not None or (exc.args and isinstance(exc.args[0], BaseException)):
        nested = exc.__cause__ or exc.args[0]
        if nested is exc:
            break
        exc = nested
    return str(exc)


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"
