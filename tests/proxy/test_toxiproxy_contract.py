"""The twin's proxy API against Toxiproxy's contract, over real HTTP with the standard library's client.

Each case is what Shopify's Toxiproxy server (2.5.0, the lab's; its api.go, toxic_collection.go,
proxy_collection.go and toxics/*.go) answers to a request the project sends or a user's Toxiproxy client would:
the route, the status, the body, and Go's decoding of the body into typed structs (every toxic attribute an
integer, so 300.0 is refused with HTTP 400). What the twin does beyond Toxiproxy, or differently, is listed in
docs/protocols.md §5.2 and not asserted here. The last cases drive the project's own Toxiproxy client
(testbed/faults/transport.py) and a playbook's fault through the same API.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.proxy import ProxyServer
from emulators.proxy.toxics import SCHEMA
from testbed.documents import load_inventory
from testbed.faults import FAULT_KINDS, ConnectionTarget, FaultEnv, FaultFailed
from testbed.faults.model import Fault
from testbed.faults.transport import TRANSPORT_FAULTS, ToxiproxyApi

NO_PROXIES = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the API is on loopback


class Api:
    """Toxiproxy's HTTP API at an address, through urllib: (status, headers, body parsed as JSON when any)."""

    def __init__(self, address: str) -> None:
        self.base = f"http://{address}"

    def __call__(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None, agent: str = "contract-test"
    ) -> tuple[int, Any, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"User-Agent": agent})
        try:
            with NO_PROXIES.open(req, timeout=5) as resp:
                status, headers, text = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, headers, text = exc.code, exc.headers, exc.read()
            exc.close()
        return status, headers, (json.loads(text) if text.strip() else None)

    def error(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict]:
        """An error answer: Toxiproxy's ApiError, exactly {"error": text, "status": code}, as text/plain."""
        status, headers, payload = self(method, path, body, raw)
        assert status >= 400, payload
        assert set(payload) == {"error", "status"} and payload["status"] == status, payload
        assert headers["Content-Type"].startswith("text/plain"), headers  # Go's http.Error
        return status, payload["error"]


@pytest.fixture
def server(loop):
    proxies = ProxyServer(seed=1)
    loop.run(proxies.start())
    yield proxies
    loop.run(proxies.close())


@pytest.fixture
def api(server) -> Api:
    return Api(server.address)


@pytest.fixture
def upstream(echo) -> str:
    return f"{echo.address[0]}:{echo.address[1]}"


@pytest.fixture
def proxy(api, upstream) -> str:
    status, _, _ = api("POST", "/proxies", {"name": "ocs1", "listen": "127.0.0.1:0", "upstream": upstream})
    assert status == 201
    return "ocs1"


# --- /proxies -----------------------------------------------------------------------------------------------


def test_proxy_create_is_201_with_the_proxy_and_its_empty_toxics(api, upstream):
    status, headers, made = api("POST", "/proxies", {"name": "ocs1", "listen": "127.0.0.1:0", "upstream": upstream})
    assert status == 201 and headers["Content-Type"] == "application/json"
    assert {k: made[k] for k in ("name", "upstream", "enabled", "toxics")} == {
        "name": "ocs1",
        "upstream": upstream,
        "enabled": True,  # Toxiproxy's default: enabled at once
        "toxics": [],
    }
    assert made["listen"].startswith("127.0.0.1:") and not made["listen"].endswith(":0")


def test_proxy_index_is_an_object_keyed_by_name(api, proxy):
    status, _, index = api("GET", "/proxies")
    assert status == 200 and list(index) == [proxy] and index[proxy]["name"] == proxy


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"upstream": "127.0.0.1:1"}, "missing required field: name"),
        ({"name": "x"}, "missing required field: upstream"),
        ({"name": "x", "upstream": ""}, "missing required field: upstream"),
        (
            {"name": 5, "upstream": "127.0.0.1:1"},
            "cannot unmarshal number into Go struct field Proxy.name of type string",
        ),
        ({"name": "x", "upstream": "127.0.0.1:1", "enabled": "no"}, "Go struct field Proxy.enabled of type bool"),
        ([{"name": "x"}], "json: cannot unmarshal array into Go value of type toxiproxy.Proxy"),
    ],
)
def test_proxy_create_refusals_are_400_with_toxiproxys_text(api, body, error):
    status, text = api.error("POST", "/proxies", body)
    assert status == 400 and text.endswith(error)


def test_proxy_create_of_a_name_taken_is_409(api, proxy, upstream):
    assert api.error("POST", "/proxies", {"name": proxy, "upstream": upstream}) == (409, "proxy already exists")


def test_proxy_show_update_delete_and_their_404(api, proxy):
    status, _, shown = api("GET", f"/proxies/{proxy}")
    assert status == 200 and shown["name"] == proxy and shown["enabled"] is True
    status, _, down = api("POST", f"/proxies/{proxy}", {"enabled": False})
    assert status == 200 and down["enabled"] is False and down["listen"] == shown["listen"]
    status, _, up = api("POST", f"/proxies/{proxy}", {"enabled": True})
    assert status == 200 and up["enabled"] is True
    assert api("DELETE", f"/proxies/{proxy}")[::2] == (204, None)
    for method, body in (("GET", None), ("POST", {"enabled": True}), ("DELETE", None)):
        assert api.error(method, f"/proxies/{proxy}", body) == (404, "proxy not found")


def test_an_empty_body_is_gos_eof_400(api, proxy):
    assert api.error("POST", f"/proxies/{proxy}/toxics", raw=b"") == (400, "bad request body: EOF")


# --- /proxies/{proxy}/toxics ----------------------------------------------------------------------------------


def test_toxic_create_is_200_not_201_with_the_toxic(api, proxy):
    toxic = {"name": "latency-1", "type": "latency", "stream": "downstream", "toxicity": 1.0, "attributes": {}}
    status, _, made = api("POST", f"/proxies/{proxy}/toxics", {**toxic, "attributes": {"latency": 300}})
    assert status == 200  # api.go's ToxicCreate writes no status: Go's default 200
    assert made == {**toxic, "attributes": {"latency": 300, "jitter": 0}}  # every attribute shown, 0 if not given
    assert api("GET", f"/proxies/{proxy}/toxics")[::2] == (200, [made])
    assert api("GET", f"/proxies/{proxy}/toxics/latency-1")[::2] == (200, made)
    assert api("GET", f"/proxies/{proxy}")[2]["toxics"] == [made]


def test_toxic_defaults_are_toxiproxys(api, proxy):
    status, _, made = api("POST", f"/proxies/{proxy}/toxics", {"type": "timeout", "attributes": {"timeout": 0}})
    assert status == 200
    assert (made["name"], made["stream"], made["toxicity"]) == ("timeout_downstream", "downstream", 1.0)
    nulls = {"type": "latency", "name": "n", "stream": None, "toxicity": None, "attributes": {"latency": None}}
    status, _, made = api("POST", f"/proxies/{proxy}/toxics", nulls)  # Go leaves a field given null as it was
    assert status == 200 and made["stream"] == "downstream" and made["attributes"] == {"latency": 0, "jitter": 0}


# Every attribute of every toxic, with the Go type and struct toxics/*.go declare for it.
ATTRIBUTES = [(t, a, go) for t, attributes in SCHEMA.items() for a, go in attributes.items()]
STRUCTS = {
    "latency": "LatencyToxic",
    "bandwidth": "BandwidthToxic",
    "slow_close": "SlowCloseToxic",
    "timeout": "TimeoutToxic",
    "reset_peer": "ResetToxic",
    "slicer": "SlicerToxic",
    "limit_data": "LimitDataToxic",
}
GO_TYPES = {  # toxics/*.go
    ("latency", "latency"): "int64",
    ("latency", "jitter"): "int64",
    ("bandwidth", "rate"): "int64",
    ("slow_close", "delay"): "int64",
    ("timeout", "timeout"): "int64",
    ("reset_peer", "timeout"): "int64",
    ("slicer", "average_size"): "int",
    ("slicer", "size_variation"): "int",
    ("slicer", "delay"): "int",
    ("limit_data", "bytes"): "int64",
}


def test_the_twins_attribute_table_is_toxiproxys():
    assert {(t, a): go for t, a, go in ATTRIBUTES} == GO_TYPES


@pytest.mark.parametrize(("toxic", "attribute", "go_type"), ATTRIBUTES)
@pytest.mark.parametrize("sent", [b"300.0", b"0.5", b"3e2", b'"300"', b"true", b"9223372036854775808"])
def test_an_integer_attribute_refuses_anything_but_an_integer_literal(api, proxy, toxic, attribute, go_type, sent):
    extra = ', "average_size": 8' if toxic == "slicer" and attribute != "average_size" else ""
    raw = b'{"type": "%s", "attributes": {"%s": %s%s}}' % (toxic.encode(), attribute.encode(), sent, extra.encode())
    status, error = api.error("POST", f"/proxies/{proxy}/toxics", raw=raw)
    what = {b'"300"': "string", b"true": "bool"}.get(sent, f"number {sent.decode()}")
    field = f"{STRUCTS[toxic]}.attributes.{attribute}"
    assert (status, error) == (
        400,
        f"bad request body: json: cannot unmarshal {what} into Go struct field {field} of type {go_type}",
    )
    assert api("GET", f"/proxies/{proxy}/toxics")[2] == []  # nothing half-applied


def test_the_findings_request_gets_the_findings_answer(api, proxy):
    """What the project sent before its attributes were integers, and what Toxiproxy 2.5.0 answered."""
    body = {
        "name": "latency-1",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 300.0},
    }
    assert api.error("POST", f"/proxies/{proxy}/toxics", body) == (
        400,
        "bad request body: json: cannot unmarshal number 300.0"
        " into Go struct field LatencyToxic.attributes.latency of type int64",
    )


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"type": "latency", "stream": "sideways"}, 400, "stream was invalid, can be either upstream or downstream"),
        ({"type": "gremlins"}, 400, "invalid toxic type"),
        ({}, 400, "invalid toxic type"),
        ({"type": "latency", "toxicity": "all"}, 400, "bad request body: json: cannot unmarshal string"
        " into Go struct field ToxicWrapper.toxicity of type float32"),
        ({"type": "latency", "toxicity": 1e39}, 400, "bad request body: json: cannot unmarshal number 1e+39"
        " into Go struct field ToxicWrapper.toxicity of type float32"),
        ({"type": 7}, 400, "bad request body: json: cannot unmarshal number"
        " into Go struct field ToxicWrapper.type of type string"),
        ({"type": "latency", "attributes": 5}, 400, "bad request body: json: cannot unmarshal number"
        " into Go struct field ToxicWrapper.attributes of type toxics.NoopToxic"),
    ],
)  # fmt: skip
def test_toxic_create_refusals(api, proxy, body, status, error):
    assert api.error("POST", f"/proxies/{proxy}/toxics", body) == (status, error)


def test_toxic_create_of_a_name_taken_is_409_before_its_attributes_are_read(api, proxy):
    assert api("POST", f"/proxies/{proxy}/toxics", {"name": "t", "type": "latency"})[0] == 200
    again = {"name": "t", "type": "latency", "attributes": {"latency": 0.5}}
    assert api.error("POST", f"/proxies/{proxy}/toxics", again) == (409, "toxic already exists")


def test_toxic_routes_of_an_unknown_proxy_are_404(api):
    for method, path, body in (
        ("GET", "/proxies/nope/toxics", None),
        ("POST", "/proxies/nope/toxics", {"type": "latency"}),
        ("GET", "/proxies/nope/toxics/t", None),
        ("POST", "/proxies/nope/toxics/t", {"toxicity": 1}),
        ("DELETE", "/proxies/nope/toxics/t", None),
    ):
        assert api.error(method, path, body) == (404, "proxy not found"), (method, path)


def test_toxic_update_and_delete_and_their_404(api, proxy):
    api("POST", f"/proxies/{proxy}/toxics", {"name": "t", "type": "latency", "attributes": {"latency": 100}})
    status, _, updated = api("POST", f"/proxies/{proxy}/toxics/t", {"attributes": {"jitter": 10}, "toxicity": 0.5})
    assert status == 200 and updated["attributes"] == {"latency": 100, "jitter": 10} and updated["toxicity"] == 0.5
    assert api.error("POST", f"/proxies/{proxy}/toxics/t", {"attributes": {"jitter": 1.5}}) == (
        400,
        "bad request body: json: cannot unmarshal number 1.5"
        " into Go struct field LatencyToxic.attributes.jitter of type int64",
    )
    assert api.error("POST", f"/proxies/{proxy}/toxics/t", {"toxicity": "x"}) == (
        400,
        "bad request body: json: cannot unmarshal string into Go struct field .toxicity of type float32",
    )
    assert api("DELETE", f"/proxies/{proxy}/toxics/t")[::2] == (204, None)
    for method, body in (("GET", None), ("POST", {"toxicity": 1}), ("DELETE", None)):
        assert api.error(method, f"/proxies/{proxy}/toxics/t", body) == (404, "toxic not found")


# --- /reset, /version, the browser guard ----------------------------------------------------------------------


def test_reset_is_204_and_removes_every_toxic_and_enables_every_proxy(api, proxy):
    api("POST", f"/proxies/{proxy}/toxics", {"type": "latency"})
    api("POST", f"/proxies/{proxy}", {"enabled": False})
    assert api("POST", "/reset")[::2] == (204, None)
    shown = api("GET", f"/proxies/{proxy}")[2]
    assert shown["toxics"] == [] and shown["enabled"] is True


def test_version_is_200(api):
    assert api("GET", "/version")[0] == 200


def test_a_browser_is_turned_away_with_403(api):
    status, headers, _ = api("GET", "/proxies", agent="Mozilla/5.0 (X11; Linux x86_64)")
    assert status == 403


# --- the project's own fault code through this API -----------------------------------------------------------

LAB = """\
name: contract-lab
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "TCPIP0::{host}::{port}::SOCKET"}}
    size: 16
    fault_proxy: {{api: "http://{api}", proxy: ocs1}}
"""


@pytest.fixture
def lab(server, proxy, tmp_path):
    host, port = Api(server.address)("GET", f"/proxies/{proxy}")[2]["listen"].rsplit(":", 1)
    (tmp_path / "lab.yaml").write_text(LAB.format(host=host, port=port, api=server.address))
    return load_inventory(tmp_path / "lab.yaml").model


def no_procedures(device: str, procedure: str, kwargs: dict):
    raise AssertionError(f"a transport fault on a lab calls no device procedure ({procedure} on {device})")


def test_a_playbooks_fault_reaches_the_api_as_integers_and_is_taken(api, lab):
    fault = Fault(kind="transport.latency", device="ocs1", attributes={"latency": 300.0, "jitter": 10})
    assert fault.attributes == {"latency": 300, "jitter": 10}
    assert all(type(v) is int for v in fault.attributes.values())  # 300.0 in the YAML is sent as 300
    target = ConnectionTarget("ocs1", "latency-1", "downstream", tuple(sorted(fault.attributes.items())))
    kind = FAULT_KINDS.get("transport.latency")
    kind.inject(FaultEnv(None, no_procedures, lab), target)
    (toxic,) = api("GET", "/proxies/ocs1/toxics")[2]
    assert toxic["attributes"] == {"latency": 300, "jitter": 10}
    kind.heal(FaultEnv(None, no_procedures, lab), target)
    assert api("GET", "/proxies/ocs1/toxics")[2] == []


@pytest.mark.parametrize("kind", sorted(k.name for k in TRANSPORT_FAULTS))
def test_every_transport_kind_is_taken_with_the_chaos_playbooks_attributes(api, lab, kind):
    """chaos-failover's attribute set, each kind taking its own, as the planner gives them."""
    given = {"latency": 20, "jitter": 10, "rate": 2, "average_size": 4, "size_variation": 3, "delay": 100, "timeout": 0}
    fault = FAULT_KINDS.get(kind)
    attributes = tuple(sorted((k, v) for k, v in Fault(kind=kind, device="ocs1", attributes={
        k: v for k, v in given.items() if k in fault.attributes
    }).attributes.items()))  # fmt: skip
    env = FaultEnv(None, no_procedures, lab)
    fault.inject(env, ConnectionTarget("ocs1", f"{kind}-1", "downstream", attributes))
    shown = api("GET", "/proxies/ocs1")[2]
    assert shown["enabled"] is (kind != "transport.down")
    assert [dict(sorted(t["attributes"].items())) for t in shown["toxics"]] == (
        [] if kind == "transport.down" else [{**dict.fromkeys(sorted(fault.attributes), 0), **dict(attributes)}]
    )
    fault.heal(env, ConnectionTarget("ocs1", f"{kind}-1", "downstream", attributes))


def test_a_float_where_toxiproxy_takes_an_int64_gets_its_400_named_by_our_client(api, lab, server):
    client = ToxiproxyApi.of(lab, "ocs1", "transport.latency")
    with pytest.raises(FaultFailed) as refused:
        client.add_toxic("latency-1", "latency", "downstream", {"latency": 20.5})
    message = str(refused.value)
    assert message.startswith(f"ocs1: the Toxiproxy API at http://{server.address}: sent POST http://{server.address}")
    assert '"attributes": {"latency": 20.5}' in message
    assert (
        "got HTTP 400: bad request body: json: cannot unmarshal number 20.5 into Go struct field "
        "LatencyToxic.attributes.latency of type int64" in message
    )
    assert "check the fault's attributes" in message


# --- Go's decoding, fuzzed ------------------------------------------------------------------------------------

json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_an_int64_attribute_takes_only_an_integer_literal_whatever_is_sent(loop, server, proxy, value):
    body = json.dumps({"name": "fuzzed", "type": "latency", "attributes": {"latency": value}}).encode()
    status, answer = loop.run(server.handle("POST", f"/proxies/{proxy}/toxics", body))
    if status == 200:
        loop.run(server.handle("DELETE", f"/proxies/{proxy}/toxics/fuzzed", b""))
    go_takes = value is None or (type(value) is int and -(2**63) <= value < 2**63)
    if not go_takes:  # Toxiproxy refuses it the same way
        assert status == 400 and answer["error"].startswith("bad request body: json: cannot unmarshal "), answer
        assert answer["error"].endswith(" into Go struct field LatencyToxic.attributes.latency of type int64")
    elif status != 200:  # Toxiproxy takes it; the twin refuses only what no latency can be (negative, absurd)
        assert status == 400 and "latency toxic attribute 'latency'" in answer["error"], answer
        assert value < 0 or value > 7 * 24 * 3600 * 1000
