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

The login (drivers/redfish/session.py) follows the service root (the Redfish standard allows both): a session
(X-Auth-Token) when the root links a SessionService, as most BMCs do; HTTP Basic on each request when it does not
(OpenStack's sushy-emulator, some older BMCs). Either way the password goes only over https: a plain-http address
is refused before anything is sent.

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
import time
from typing import Any

from drivers.audit import AuditSink, record
from drivers.errors import DeviceCommandError, DeviceProtocolError, DeviceTimeout
from drivers.redfish.failures import BmcErrors
from drivers.redfish.payload import ROOT, clip, json_of, link, path_of, text_of
from drivers.redfish.session import BmcSession
from drivers.redfish.settings import RedfishSettings

__all__ = ["RedfishBmc", "RedfishSettings"]  # RedfishSettings is drivers.redfish.settings', here too


class RedfishBmc:
    """One host's power through its BMC; the login (opened on first use, closed by `close`) is BmcSession's.
    `device` is the host the BMC powers: every error names it, with the BMC's address.
    """

    def __init__(self, settings: RedfishSettings, device: str, audit: AuditSink | None = None) -> None:
        self.settings = settings
        self.device = device
        self.address = settings.address
        self.audit = audit
        self._errors = BmcErrors(settings, device)
        self._session = BmcSession(settings, device, audit, self._errors)
        self._system: dict | None = None  # {"path", "reset", "allowed"}

    @property
    def auth(self) -> str | None:
        """How the driver logged in: "session" or "basic", from the service root (None before the login)."""
        return self._session.auth

    # --- power --------------------------------------------------------------------------------------------

    def power_state(self) -> str:
        """The system's PowerState: "On", "Off", "PoweringOn", "PoweringOff" (or what the BMC says)."""
        body = self._get(self._system_info()["path"], "read the host's power state")
        state = body.get("PowerState")
        if not isinstance(state, str):
            raise self._errors.error(
                DeviceProtocolError,
                "the BMC's ComputerSystem has no PowerState",
                sent=f"GET {self._system_info()['path']}",
                received=clip(json.dumps(body)),
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
            raise self._errors.error(
                DeviceCommandError,
                f"the BMC does not offer ResetType {kind!r}",
                sent=f"(nothing: {system['reset']} allows {', '.join(allowed)})",
                hint="this BMC cannot do that reset through Redfish; use one it lists, or the vendor's tools",
            )
        body = {"ResetType": kind}
        resp, t0, t1 = self._request("POST", system["reset"], body)
        if resp.status not in (200, 202, 204):
            raise self._errors.http_error(
                resp, f"POST {system['reset']} {json.dumps(body)}", f"ComputerSystem.Reset {kind}"
            )
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
                raise self._errors.error(
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
        self._session.logout()

    def __enter__(self) -> RedfishBmc:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- requests -----------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[Any, int, int]:
        """One request on the session; logs in again once if the BMC dropped the session (401)."""
        from redfish.rest.v1 import RetriesExhaustedError

        sent = f"{method} {path}" + (f" {json.dumps(body)}" if body is not None else "")
        for attempt in (1, 2):
            client = self._session.client()
            t0 = record(self.audit, self.device, self.address, "tx", sent)
            try:
                if method == "GET":
                    resp = client.get(path)
                else:
                    resp = client.post(path, body=body)
            except RetriesExhaustedError as exc:
                self._session.drop()
                raise self._errors.transport_error(exc, sent, self.settings.ca_file) from None
            t1 = record(self.audit, self.device, self.address, "rx", f"{resp.status} {clip(text_of(resp))}")
            if resp.status == 401 and attempt == 1 and self._session.auth == "session":
                self._session.drop()  # the session timed out or the BMC restarted: a 401 means nothing was done
                continue
            return resp, t0, t1
        return resp, t0, t1

    def _get(self, path: str, what: str) -> dict:
        resp, _, _ = self._request("GET", path)
        if resp.status != 200:
            raise self._errors.http_error(resp, f"GET {path}", what)
        body = json_of(resp)
        if not isinstance(body, dict):
            raise self._errors.error(
                DeviceProtocolError,
                f"the BMC's {path} is not a JSON object",
                sent=f"GET {path}",
                received=clip(text_of(resp)),
                hint="check bmc.address: it must be the BMC's Redfish service",
            )
        return body

    def _system_info(self) -> dict:
        """The ComputerSystem this BMC powers: its path, its Reset action's target and allowed ResetTypes."""
        if self._system is not None:
            return self._system
        client = self._session.client()
        systems = link(getattr(client, "root", None), "Systems") or f"{ROOT}/Systems"
        collection = self._get(systems, "list the BMC's systems")
        members = [path_of(m.get("@odata.id", "")) for m in collection.get("Members") or [] if isinstance(m, dict)]
        members = [m for m in members if m]
        wanted = self.settings.system
        if wanted is None:
            if not members:
                raise self._errors.error(
                    DeviceCommandError,
                    "the BMC lists no system in its Systems collection",
                    sent=f"GET {systems}",
                    received=clip(json.dumps(collection)),
                    hint="this BMC powers nothing through Redfish; check bmc.address",
                )
            path = members[0]
        else:
            found = next((m for m in members if m.rstrip("/").rsplit("/", 1)[-1] == wanted), None)
            if found is None:
                ids = ", ".join(m.rstrip("/").rsplit("/", 1)[-1] for m in members) or "none"
                raise self._errors.error(
                    DeviceCommandError,
                    f"the BMC has no system {wanted!r}",
                    sent=f"GET {systems}",
                    received=f"members: {ids}",
                    hint=f"set bmc.system to one of: {ids} (or leave it out to use the first)",
                )
            path = found
        system = self._get(path, "read the ComputerSystem")
        action = (system.get("Actions") or {}).get("#ComputerSystem.Reset") or {}
        target = path_of(action.get("target") or "") or f"{path}/Actions/ComputerSystem.Reset"
        allowed = action.get("ResetType@Redfish.AllowableValues")
        self._system = {
            "path": path,
            "reset": target,
            "allowed": [a for a in allowed if isinstance(a, str)] if isinstance(allowed, list) else None,
        }
        return self._system
