"""One emulated BMC's Redfish service, without a transport: (method, path, headers, body) -> Response.

The resource tree is the standard one a DMTF Redfish client walks (the layout OpenStack's sushy-tools
serves, cut down to what power control needs):

    /redfish                                           {"v1": "/redfish/v1/"}            no login needed
    /redfish/v1                                        ServiceRoot                       no login needed
    /redfish/v1/Systems                                ComputerSystemCollection (one member)
    /redfish/v1/Systems/1                              ComputerSystem: PowerState, the Reset action
    /redfish/v1/Systems/1/Actions/ComputerSystem.Reset POST {"ResetType": ...} -> 204
    /redfish/v1/SessionService                         SessionService
    /redfish/v1/SessionService/Sessions                POST {"UserName", "Password"} -> 201, X-Auth-Token
    /redfish/v1/SessionService/Sessions/<id>           GET, DELETE (log out)

Every other request needs a session token (X-Auth-Token) or HTTP Basic credentials. Errors are Redfish error
bodies (`error` with `@Message.ExtendedInfo` from the Base message registry) with the status code the
specification gives; nothing a client sends makes `handle` raise.

The power target is the emulated host (emulators/gpuhost/host.py): ForceOff really kills its processes and
closes its SSH port, On opens it again, exactly as the twin's power_off / power_on control ops do.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ROOT = "/redfish/v1"
SYSTEM_ID = "1"
SYSTEMS = f"{ROOT}/Systems"
SYSTEM = f"{SYSTEMS}/{SYSTEM_ID}"
RESET = f"{SYSTEM}/Actions/ComputerSystem.Reset"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
# What the ComputerSystem offers (ResetType@Redfish.AllowableValues). The emulated host has no operating system to
# ask, so a graceful reset is its forced one; ForceOn is On. The graceful ones are how a Redfish client asks for
# a soft power off or reboot; OpenStack's sushy-emulator offers them and ForceOn, as most BMCs do
# (docs/protocols.md §9.6).
RESET_TYPES = ("On", "ForceOn", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart", "PowerCycle")
OFF_TYPES = ("ForceOff", "GracefulShutdown")
ON_TYPES = ("On", "ForceOn")
REGISTRY = "Base.1.8"
MAX_SESSIONS = 16  # a real BMC has a handful of session slots; a client that never logs out runs out of them
SESSION_TIMEOUT_S = 1800  # an idle session is dropped after this (the SessionService's SessionTimeout)
JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8", "OData-Version": "4.0"}


class PowerTarget(Protocol):
    """What the BMC powers: the emulated host (emulators.gpuhost.host.GpuHostEngine)."""

    powered: bool

    def power_off(self) -> Any: ...

    def power_on(self) -> Any: ...


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


# Base registry messages: id -> (text with %1.. for its arguments, severity, resolution)
MESSAGES: dict[str, tuple[str, str, str]] = {
    "ResourceMissingAtURI": (
        "The resource at the URI '%1' was not found.",
        "Critical",
        "Place a valid resource at the URI or correct the URI and resubmit the request.",
    ),
    "OperationNotAllowed": (
        "The HTTP method '%1' is not allowed on the resource at '%2'.",
        "Critical",
        "Use one of the methods the resource allows (the response's Allow header).",
    ),
    "MalformedJSON": (
        "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
        "Critical",
        "Ensure that the request body is valid JSON and resubmit the request.",
    ),
    "ActionParameterMissing": (
        "The action %1 requires the parameter %2 to be present in the request body.",
        "Critical",
        "Supply the action with the required parameter in the request body when the request is resubmitted.",
    ),
    "ActionParameterValueNotInList": (
        "The value '%1' for the parameter %2 in the action %3 is not in the list of acceptable values.",
        "Warning",
        "Choose a value from the enumeration list that the implementation can support and resubmit the request.",
    ),
    "ActionParameterValueTypeError": (
        "The value '%1' for the parameter %2 in the action %3 is of a different type than the parameter can accept.",
        "Warning",
        "Correct the value for the parameter in the request body and resubmit the request if the operation failed.",
    ),
    "ActionParameterUnknown": (
        "The action %1 was submitted with the invalid parameter %2.",
        "Warning",
        "Correct the invalid parameter and resubmit the request if the operation failed.",
    ),
    "ActionNotSupported": (
        "The action %1 is not supported by the resource.",
        "Critical",
        "The action supplied cannot be resubmitted to the implementation.  Perhaps the action was invalid, the "
        "wrong resource was the target or the implementation documentation may be of assistance.",
    ),
    "PropertyMissing": (
        "The property %1 is a required property and must be included in the request.",
        "Warning",
        "Ensure that the property is in the request body and has a valid value and resubmit the request if the "
        "operation failed.",
    ),
    "PropertyValueTypeError": (
        "The value '%1' for the property %2 is of a different type than the property can accept.",
        "Warning",
        "Correct the value for the property in the request body and resubmit the request if the operation failed.",
    ),
    "NoValidSession": (
        "There is no valid session established with the implementation.",
        "Critical",
        "Establish a session before attempting any operations.",
    ),
    "ResourceAtUriUnauthorized": (
        "While accessing the resource at '%1', the service received an authorization error '%2'.",
        "Critical",
        "Ensure that the appropriate access is provided for the service in order for it to access the URI.",
    ),
    "SessionLimitExceeded": (
        "The session establishment failed due to the number of simultaneous sessions exceeding the limit of the "
        "implementation.",
        "Critical",
        "Reduce the number of other sessions before trying to establish the session or increase the limit of "
        "simultaneous sessions (if supported).",
    ),
    "InternalError": (
        "The request failed due to an internal service error.  The service is still operational.",
        "Critical",
        "Resubmit the request.  If the problem persists, consider resetting the service.",
    ),
    "GeneralError": (
        "%1",
        "Critical",
        "None.",
    ),
}


def error(status: int, message_id: str, *args: Any, headers: Mapping[str, str] | None = None) -> Response:
    """A Redfish error response: the general error with one extended message from the Base registry."""
    text, severity, resolution = MESSAGES[message_id]
    shown = [_short(a) for a in args]
    for i, arg in enumerate(shown, 1):
        text = text.replace(f"%{i}", arg)
    body = {
        "error": {
            "code": f"{REGISTRY}.GeneralError",
            "message": "A general error has occurred. See ExtendedInfo for more information.",
            "@Message.ExtendedInfo": [
                {
                    "@odata.type": "#Message.v1_1_1.Message",
                    "MessageId": f"{REGISTRY}.{message_id}",
                    "Message": text,
                    "MessageArgs": shown,
                    "Severity": severity,
                    "Resolution": resolution,
                }
            ],
        }
    }
    return _json(status, body, headers)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, json.dumps(body).encode(), {**JSON_HEADERS, **(headers or {})})


@dataclass
class _Session:
    id: str
    token: str
    user: str
    last_used: float


class RedfishService:
    """One BMC: its account (one user, one password), its sessions, the host it powers. Thread-safe: each
    connection is served on a thread of its own.
    """

    def __init__(self, name: str, target: PowerTarget, user: str, password: str) -> None:
        self.name = name
        self.target = target
        self.user = user
        self.password = password
        self._sessions: dict[str, _Session] = {}  # by token
        self._lock = threading.Lock()
        self._next_id = 1
        self._power = threading.Lock()  # one reset at a time, as a BMC's power sequencer takes them

    # --- the one entry point ---------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Response:
        """One request -> its response. `headers` keys are lower case. Never raises."""
        try:
            return self._handle(method.upper(), _path(target), headers, body)
        except Exception as exc:  # a bug here must look like a BMC's internal error, not a dead BMC
            return error(500, "InternalError", headers={"X-Testbed-Error": type(exc).__name__})

    def _handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        if path == "/redfish":
            return self._read_only(method, path) or _json(200, {"v1": f"{ROOT}/"})
        if path == ROOT:
            return self._read_only(method, path) or _json(200, self._service_root())
        if path == SESSIONS and method == "POST":
            return self._login(headers, body)
        if path not in (SYSTEMS, SYSTEM, RESET, SESSION_SERVICE, SESSIONS) and not self._is_session(path):
            # An unknown URI is 404 whether or not the client logged in: it names no resource of this BMC.
            return error(404, "ResourceMissingAtURI", path)
        denied = self._authenticate(headers, path)
        if denied is not None:
            return denied
        if path == RESET:
            if method != "POST":
                return error(405, "OperationNotAllowed", method, path, headers={"Allow": "POST"})
            return self._reset(headers, body)
        if path == SESSIONS:
            return self._read_only(method, path, "GET, POST") or _json(200, self._session_collection())
        if self._is_session(path):
            return self._session_resource(method, path)
        resource = {SYSTEMS: self._systems, SYSTEM: self._system, SESSION_SERVICE: self._session_service}[path]
        return self._read_only(method, path) or _json(200, resource())

    @staticmethod
    def _read_only(method: str, path: str, allow: str = "GET, HEAD") -> Response | None:
        if method in ("GET", "HEAD"):
            return None
        return error(405, "OperationNotAllowed", method, path, headers={"Allow": allow})

    # --- authentication --------------------------------------------------------------------------------

    def _authenticate(self, headers: Mapping[str, str], path: str) -> Response | None:
        token = headers.get("x-auth-token")
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if token is not None:
                session = self._sessions.get(token)
                if session is not None:
                    session.last_used = now
                    return None
        basic = headers.get("authorization", "")
        if basic[:6].lower() == "basic " and self._basic_ok(basic[6:].strip()):
            return None
        challenge = {"WWW-Authenticate": 'Basic realm="Redfish"'}
        if token is not None or basic:
            return error(401, "ResourceAtUriUnauthorized", path, "Unauthorized", headers=challenge)
        return error(401, "NoValidSession", headers=challenge)

    def _basic_ok(self, encoded: str) -> bool:
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, ValueError):
            return False
        return bool(sep) and self._credentials_ok(user, password)

    def _credentials_ok(self, user: str, password: str) -> bool:
        # Compared in constant time, as a BMC should: the twin's password is public, a lab's is not.
        same_user = hmac.compare_digest(user.encode("utf-8", "surrogatepass"), self.user.encode())
        same_password = hmac.compare_digest(password.encode("utf-8", "surrogatepass"), self.password.encode())
        return same_user and same_password

    def _expire(self, now: float) -> None:
        for token in [t for t, s in self._sessions.items() if now - s.last_used > SESSION_TIMEOUT_S]:
            del self._sessions[token]

    def _login(self, headers: Mapping[str, str], body: bytes) -> Response:
        data = _object(headers, body)
        if isinstance(data, Response):
            return data
        for key in ("UserName", "Password"):
            if key not in data:
                return error(400, "PropertyMissing", key)
            if not isinstance(data[key], str):
                return error(400, "PropertyValueTypeError", "***" if key == "Password" else data[key], key)
        if not self._credentials_ok(data["UserName"], data["Password"]):
            return error(401, "ResourceAtUriUnauthorized", SESSIONS, "invalid user name or password")
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if len(self._sessions) >= MAX_SESSIONS:
                return error(503, "SessionLimitExceeded")
            session = _Session(str(self._next_id), secrets.token_hex(16), data["UserName"], now)
            self._next_id += 1
            self._sessions[session.token] = session
        location = f"{SESSIONS}/{session.id}"
        return _json(201, self._session_body(session), {"X-Auth-Token": session.token, "Location": location})

    def _is_session(self, path: str) -> bool:
        prefix = SESSIONS + "/"
        return path.startswith(prefix) and path[len(prefix) :].isdigit() and path[len(prefix) :].isascii()

    def _session_resource(self, method: str, path: str) -> Response:
        sid = path.rsplit("/", 1)[1]
        with self._lock:
            found = next((s for s in self._sessions.values() if s.id == sid), None)
            if found is None:
                return error(404, "ResourceMissingAtURI", path)
            if method == "DELETE":
                del self._sessions[found.token]
                return Response(204)
        return self._read_only(method, path, "GET, HEAD, DELETE") or _json(200, self._session_body(found))

    # --- the system and its power ----------------------------------------------------------------------

    def _reset(self, headers: Mapping[str, str], body: bytes) -> Response:
        action = "ComputerSystem.Reset"
        data = _object(headers, body)
        if isinstance(data, Response):
            return data
        unknown = sorted(k for k in data if k != "ResetType")
        if unknown:
            return error(400, "ActionParameterUnknown", action, unknown[0])
        if "ResetType" not in data:
            return error(400, "ActionParameterMissing", action, "ResetType")
        kind = data["ResetType"]
        if not isinstance(kind, str):
            return error(400, "ActionParameterValueTypeError", kind, "ResetType", action)
        if kind not in RESET_TYPES:
            return error(400, "ActionParameterValueNotInList", kind, "ResetType", action)
        with self._power:
            if kind not in ON_TYPES and self.target.powered:  # off, or the first half of a restart
                self.target.power_off()
            if kind not in OFF_TYPES:
                self.target.power_on()
        return Response(204, b"", {"OData-Version": "4.0"})

    def _service_root(self) -> dict:
        return {
            "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
            "@odata.id": f"{ROOT}/",
            "Id": "RootService",
            "Name": f"Root Service of the BMC of {self.name} (testbed twin)",
            "RedfishVersion": "1.6.0",
            "UUID": _uuid(self.name),
            "Systems": {"@odata.id": SYSTEMS},
            "SessionService": {"@odata.id": SESSION_SERVICE},
            "Links": {"Sessions": {"@odata.id": SESSIONS}},
        }

    def _systems(self) -> dict:
        return {
            "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
            "@odata.id": SYSTEMS,
            "Name": "Computer System Collection",
            "Members@odata.count": 1,
            "Members": [{"@odata.id": SYSTEM}],
        }

    def _system(self) -> dict:
        on = bool(self.target.powered)
        return {
            "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
            "@odata.id": SYSTEM,
            "Id": SYSTEM_ID,
            "Name": self.name,
            "HostName": self.name,
            "SystemType": "Physical",
            "Manufacturer": "testbed",
            "Model": "emulated GPU host",
            "UUID": _uuid(self.name + "/system"),
            "PowerState": "On" if on else "Off",
            "Status": {"State": "Enabled" if on else "StandbyOffline", "Health": "OK"},
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": RESET,
                    "ResetType@Redfish.AllowableValues": list(RESET_TYPES),
                }
            },
        }

    def _session_service(self) -> dict:
        return {
            "@odata.type": "#SessionService.v1_1_8.SessionService",
            "@odata.id": SESSION_SERVICE,
            "Id": "SessionService",
            "Name": "Session Service",
            "ServiceEnabled": True,
            "SessionTimeout": SESSION_TIMEOUT_S,
            "Sessions": {"@odata.id": SESSIONS},
        }

    def _session_collection(self) -> dict:
        with self._lock:
            ids = sorted((s.id for s in self._sessions.values()), key=int)
        return {
            "@odata.type": "#SessionCollection.SessionCollection",
            "@odata.id": SESSIONS,
            "Name": "Session Collection",
            "Members@odata.count": len(ids),
            "Members": [{"@odata.id": f"{SESSIONS}/{i}"} for i in ids],
        }

    @staticmethod
    def _session_body(session: _Session) -> dict:
        return {
            "@odata.type": "#Session.v1_3_0.Session",
            "@odata.id": f"{SESSIONS}/{session.id}",
            "Id": session.id,
            "Name": "User Session",
            "UserName": session.user,
        }


def _path(target: str) -> str:
    """The resource a request target names: the query (`$expand`, `$select`) and a trailing slash left out."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    while len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return path


def _object(headers: Mapping[str, str], body: bytes) -> dict | Response:
    """A request body that must be one JSON object, or the error to answer. It must say it is JSON
    (Content-Type application/json, a charset allowed): sushy-emulator (Flask) and many BMCs answer 415 to a body
    without that header, so the twin does too, and a client that leaves it out fails here as on a lab.
    """
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = media or "no Content-Type"
        return error(
            415, "GeneralError", f"the request body must be sent as Content-Type application/json, not {shown}"
        )
    try:
        data = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return error(400, "MalformedJSON")
    if not isinstance(data, dict):
        return error(400, "MalformedJSON")
    return data


def _uuid(seed: str) -> str:
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"testbed-twin-bmc:{seed}"))
