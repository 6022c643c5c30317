"""Property tests of the emulated BMC's request handling (emulators/redfish): whatever a client sends, the BMC
answers with a status the Redfish specification gives and, for an error, a Redfish error body (a Base
registry MessageId and its message), never an internal error, and it keeps serving. The host behind it is a
real emulated host's state (GpuHostEngine): a request the BMC refused leaves its power as it was.

Directly on RedfishService.handle (methods, paths, headers, JSON bodies), and over a real HTTPS connection to
RedfishServer (request lines, Content-Length, bodies: the framing this package adds to http.server's).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.spec import GpuHostSpec
from emulators.redfish import RESET_TYPES, RedfishServer, RedfishService

USER, PASSWORD = "admin", "bmc-pw"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
RESET = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
JSON = {"content-type": "application/json"}
JSON_BASIC = {"authorization": BASIC, **JSON}
PATHS = [
    "/redfish", "/redfish/", "/redfish/v1", "/redfish/v1/", "/redfish/v1/Systems", "/redfish/v1/Systems/1",
    "/redfish/v1/Systems/1/", RESET, "/redfish/v1/SessionService", "/redfish/v1/SessionService/Sessions",
    "/redfish/v1/SessionService/Sessions/1", "/redfish/v1/SessionService/Sessions/99", "/redfish/v1/Systems/2",
    "/redfish/v1/Chassis", "/redfish/v1/Systems/1?$expand=.", "/", "", "//", "/redfish/v1/Systems/1/Actions",
    "/redfish/v1/SessionService/Sessions/١", "/redfish/v1/$metadata",
]  # fmt: skip
METHODS = ["GET", "HEAD", "POST", "PATCH", "PUT", "DELETE", "OPTIONS", "get", "TRACE", ""]
KEYS = ["ResetType", "UserName", "Password", "Oem", "resettype", ""]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from([*RESET_TYPES, USER, PASSWORD, "GracefulShutdown", "Nmi", "on", "forceoff"]),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner), max_leaves=10
)
objects = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), json_values, max_size=4)
bodies = st.one_of(
    objects.map(lambda o: json.dumps(o).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=80),
    st.text(max_size=80).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"{", b'{"ResetType": ', b"[" * 5000, b'{"ResetType": "On"', b"\xff\xfe{}", b"null"]),
)
auth = st.one_of(
    st.just({}),
    st.just(JSON_BASIC),
    st.text(max_size=40).map(lambda t: {"authorization": t}),
    st.binary(max_size=30).map(lambda b: {"authorization": "Basic " + base64.b64encode(b).decode()}),
    st.text(max_size=40).map(lambda t: {"x-auth-token": t}),
)


def engine(tmp_path_factory) -> GpuHostEngine:
    return GpuHostEngine(GpuHostSpec("gpu01", gpus=1), tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> GpuHostEngine:
    return engine(tmp_path_factory)


def check_response(response) -> dict | None:
    """What every answer must be: a status Redfish uses, OData-Version, and a Redfish error body for an
    error; never a 500 (a bug in a handler).
    """
    assert response.status in {200, 201, 204, 400, 401, 404, 405, 411, 413, 415, 503}, response.status
    assert response.headers.get("OData-Version") == "4.0"
    if response.status == 204:
        assert response.body == b""
        return None
    body = json.loads(response.body)
    if response.status >= 400:
        info = body["error"]["@Message.ExtendedInfo"]
        assert info and info[0]["MessageId"].startswith("Base.1.8.") and info[0]["Message"]
    return body


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(METHODS), path=st.sampled_from(PATHS) | st.text(max_size=30), headers=auth, body=bodies)
@example(method="POST", path=RESET, headers=JSON_BASIC, body=b"[" * 100_000)
def test_any_request_gets_a_redfish_answer_and_a_refused_one_changes_nothing(host, method, path, headers, body):
    service = RedfishService("gpu01", host, USER, PASSWORD)
    host.power_on()
    response = service.handle(method, path, headers, body)
    check_response(response)
    if response.status >= 400:
        assert host.powered  # only an accepted ForceOff takes the power away


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
@example(body=b'{"ResetType": "ForceOff"')
@example(body=b'{"ResetType": "ForceOff"}{}')
@example(body=b"\xef\xbb\xbf{}")
def test_a_reset_body_that_is_not_one_json_object_is_malformed_json(host, body):
    try:
        parsed = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        return  # a well-formed object: the next test's business
    host.power_on()
    response = RedfishService("gpu01", host, USER, PASSWORD).handle("POST", RESET, JSON_BASIC, body)
    assert response.status == 400
    assert check_response(response)["error"]["@Message.ExtendedInfo"][0]["MessageId"] == "Base.1.8.MalformedJSON"
    assert host.powered


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(media=st.sampled_from(["", "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]) | st.text())
@example(media="")
def test_a_body_not_sent_as_json_is_unsupported_media_type_and_changes_nothing(host, media):
    headers = {"authorization": BASIC, **({"content-type": media} if media else {})}
    host.power_on()
    service = RedfishService("gpu01", host, USER, PASSWORD)
    response = service.handle("POST", RESET, headers, b'{"ResetType": "ForceOff"}')
    if media.split(";", 1)[0].strip().lower() == "application/json":
        assert response.status == 204
        return
    assert response.status == 415 and host.powered  # as sushy-emulator (Flask) and many BMCs answer
    assert "Content-Type application/json" in check_response(response)["error"]["@Message.ExtendedInfo"][0]["Message"]
    login = service.handle(
        "POST", "/redfish/v1/SessionService/Sessions", headers, b'{"UserName": "a", "Password": "b"}'
    )
    assert login.status == 415
    charset = {"authorization": BASIC, "content-type": "Application/JSON; charset=utf-8"}
    assert service.handle("POST", RESET, charset, b'{"ResetType": "On"}').status == 204


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=json_values, extra=objects)
@example(kind="forceoff", extra={})
@example(kind="ForceOff", extra={"Oem": 1})
@example(kind=None, extra={})
def test_a_reset_type_not_offered_or_an_unknown_parameter_is_refused_by_name(host, kind, extra):
    host.power_on()
    body = {**extra, "ResetType": kind}
    response = RedfishService("gpu01", host, USER, PASSWORD).handle(
        "POST", RESET, JSON_BASIC, json.dumps(body).encode()
    )
    ids = {r["MessageId"] for r in (check_response(response) or {}).get("error", {}).get("@Message.ExtendedInfo", [])}
    if set(body) != {"ResetType"}:
        assert response.status == 400 and ids == {"Base.1.8.ActionParameterUnknown"}
    elif not isinstance(kind, str):
        assert response.status == 400 and ids == {"Base.1.8.ActionParameterValueTypeError"}
    elif kind not in RESET_TYPES:
        assert response.status == 400 and ids == {"Base.1.8.ActionParameterValueNotInList"}
    else:
        assert response.status == 204 and host.powered == (kind not in ("ForceOff", "GracefulShutdown"))
    if response.status == 400:
        assert host.powered


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.text(st.characters(codec="ascii", exclude_characters="?#"), min_size=1, max_size=40),
    method=st.sampled_from(["GET", "POST", "DELETE", "PATCH"]),
    logged_in=st.booleans(),
)
@example(path="/redfish/v1/Systems/1/Bios", method="GET", logged_in=True)
@example(path="/redfish/v1/SessionService/Sessions/0x1", method="DELETE", logged_in=False)
def test_an_unknown_path_is_resource_missing_whether_or_not_logged_in(host, path, method, logged_in):
    known = {"/redfish", "/redfish/v1", "/redfish/v1/Systems", "/redfish/v1/Systems/1", RESET}
    known |= {"/redfish/v1/SessionService", "/redfish/v1/SessionService/Sessions"}
    trimmed = path.rstrip("/") or "/"
    if trimmed in known or trimmed.startswith("/redfish/v1/SessionService/Sessions/"):
        return
    response = RedfishService("gpu01", host, USER, PASSWORD).handle(
        method, path, JSON_BASIC if logged_in else {}, b"{}"
    )
    assert response.status == 404
    info = check_response(response)["error"]["@Message.ExtendedInfo"][0]
    assert info["MessageId"] == "Base.1.8.ResourceMissingAtURI" and trimmed in info["Message"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(login=objects)
@example(login={"UserName": USER, "Password": PASSWORD})
@example(login={"UserName": USER, "Password": PASSWORD + " "})
@example(login={"UserName": USER, "Password": "\ud800"})
def test_a_login_opens_a_session_only_with_the_accounts_credentials(host, login):
    service = RedfishService("gpu01", host, USER, PASSWORD)
    response = service.handle("POST", "/redfish/v1/SessionService/Sessions", JSON, json.dumps(login).encode())
    body = check_response(response)
    if login.get("UserName") == USER and login.get("Password") == PASSWORD:
        assert response.status == 201 and body["UserName"] == USER
        token = response.headers["X-Auth-Token"]
        assert service.handle("GET", "/redfish/v1/Systems/1", {"x-auth-token": token}, b"").status == 200
        assert service.handle("DELETE", response.headers["Location"], {"x-auth-token": token}, b"").status == 204
        assert service.handle("GET", "/redfish/v1/Systems/1", {"x-auth-token": token}, b"").status == 401
    else:
        assert response.status in (400, 401) and "X-Auth-Token" not in response.headers


def test_sessions_are_limited_like_a_bmcs_slots(host):
    service = RedfishService("gpu01", host, USER, PASSWORD)
    login = json.dumps({"UserName": USER, "Password": PASSWORD}).encode()
    statuses = [service.handle("POST", "/redfish/v1/SessionService/Sessions", JSON, login).status for _ in range(20)]
    assert statuses.count(201) == 16 and statuses[16:] == [503] * 4


# --- over the wire --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[RedfishServer, GpuHostEngine, int]]:
    target = engine(tmp_path_factory)
    srv = RedfishServer()
    ep = srv.add("gpu01", target, USER, PASSWORD)
    srv.start()
    yield srv, target, int(ep["redfish"].rsplit(":", 1)[1])
    srv.close()


def exchange(srv: RedfishServer, port: int, raw: bytes) -> bytes:
    """Send raw bytes on a verified TLS connection; everything the BMC answers until it closes or goes quiet."""
    context = ssl.create_default_context(cafile=str(srv.cert_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        with context.wrap_socket(plain, server_hostname="127.0.0.1") as tls:
            tls.sendall(raw)
            tls.settimeout(0.5 if not raw.endswith(b"\r\n\r\n") else 5)
            out = b""
            try:
                while chunk := tls.recv(65536):
                    out += chunk
                    if b"\r\n\r\n" in out and _complete(out):
                        break
            except (TimeoutError, ConnectionError, ssl.SSLError):
                pass
    return out


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def get_root(srv: RedfishServer, port: int) -> bytes:
    return exchange(srv, port, b"GET /redfish/v1 HTTP/1.1\r\nHost: bmc\r\nConnection: close\r\n\r\n")


lengths = st.one_of(
    st.integers(0, 200).map(str), st.sampled_from(["-1", "abc", "1e3", " 5", "99999999999999", "٣", "", "0x10"])
)


@settings(max_examples=60, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "BREW", "G ET", ""]),
    path=st.sampled_from(PATHS) | st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=30),
    length=lengths,
    body=st.binary(max_size=120),
    chunked=st.booleans(),
)
@example(method="POST", path=RESET, length="99999999", body=b"{}", chunked=False)
@example(method="POST", path=RESET, length="-1", body=b"{}", chunked=False)
@example(method="POST", path=RESET, length="2", body=b"{}", chunked=True)
def test_the_wire_framing_never_breaks_the_bmc(server, method, path, length, body, chunked):
    srv, target, port = server
    target.power_on()
    head = f"{method} {path} HTTP/1.1\r\nHost: bmc\r\nAuthorization: {BASIC}\r\nContent-Length: {length}\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else ""
    answer = exchange(srv, port, head.encode("utf-8", "surrogatepass") + b"\r\n" + body)
    if answer:
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        status = int(status_line.split()[1])
        assert status != 500
        _, _, payload = rest.partition(b"\r\n\r\n")
        if status >= 400 and payload:
            assert json.loads(payload)["error"]["@Message.ExtendedInfo"][0]["MessageId"].startswith("Base.1.8.")
    assert b"HTTP/1.1 200" in get_root(srv, port)  # and the next client is served


# --- what the driver reads from a BMC to choose its login (drivers/redfish/bmc.py) ------------------------------


@settings(max_examples=300, deadline=None)
@given(root=json_values, session=st.sampled_from([None, "SessionService", "Links"]))
@example(root={"SessionService": "/redfish/v1/SessionService"}, session=None)
@example(root={"Links": {"Sessions": []}, "SessionService": {"@odata.id": 5}}, session=None)
def test_the_login_is_chosen_from_any_service_root_without_raising(root, session):
    """A session where the root links a SessionService (or Links.Sessions), HTTP Basic otherwise, whatever a BMC
    put in their place (a string, a list, a number: no link).
    """
    from drivers.redfish.session import has_session_service as _has_session_service

    if session is not None:
        root = root if isinstance(root, dict) else {}
        link = {"@odata.id": "/redfish/v1/SessionService/Sessions"}
        root = {**root, **({"SessionService": link} if session == "SessionService" else {"Links": {"Sessions": link}})}
        assert _has_session_service(root) is True
    elif isinstance(root, dict):
        links = root.get("Links") if isinstance(root.get("Links"), dict) else {}
        chosen = _has_session_service(root)
        assert isinstance(chosen, bool)
        if not isinstance(root.get("SessionService"), dict) and not isinstance(links.get("Sessions"), dict):
            assert chosen is False  # nothing there is a link: HTTP Basic


@settings(max_examples=300, deadline=None)
@given(status=st.integers(100, 599) | st.text(max_size=5), message=st.text(max_size=80))
@example(status=503, message="The session establishment failed due to the number of simultaneous sessions")
@example(status=404, message="Not found")
def test_a_failed_session_login_gets_the_hint_for_its_failure(status, message):
    """The slot hint only for a BMC out of sessions (503, SessionLimitExceeded); the library's text is parsed
    whatever it holds.
    """
    from drivers.redfish.session import session_hint as _session_hint

    hint = _session_hint(f"HTTP {status}: Failed to create the session\n{message}")
    slots = str(status) == "503" or "SessionLimitExceeded" in message or "session limit" in message.lower()
    assert ("no free session slot" in hint) == slots
    if str(status) in ("404", "405", "501") and not slots:
        assert "does not take a session login" in hint
