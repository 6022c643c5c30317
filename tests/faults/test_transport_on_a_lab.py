"""transport.* on a lab: through the Toxiproxy the inventory puts in front of a device (`fault_proxy:`).

The Toxiproxy here is the twin's fault proxy served over Toxiproxy's HTTP API (what `testbed emulate
--fault-proxy` prints); the inventory is written as a lab's, with the proxy's listen address as the device's
address. The kinds are driven with no twin (FaultEnv.twin None, as in a lab run) and observed through the real
driver over TCP. A small HTTP server stands in for a broken Toxiproxy to see what malformed answers give.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drivers.errors import DeviceError
from testbed.cli.main import main
from testbed.contracts.errors import ConfigError
from testbed.documents import load_inventory
from testbed.families.drivers import make_driver
from testbed.faults import FAULT_KINDS, ConnectionTarget, FaultEnv, FaultFailed
from testbed.faults.transport import ToxiproxyApi
from testbed.ops.heal import HealDevices
from testbed.ops.remains import ActiveFault

LAB = """\
name: proxied-lab
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "{visa}", timeout_ms: 1000}}
    size: 16
    fault_proxy: {{api: "{api}", proxy: ocs1}}
  ocs2:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "TCPIP0::127.0.0.1::9::SOCKET"}}
    size: 16
"""


@pytest.fixture
def lab(twin, ctl, tmp_path):
    """The lab's inventory (ocs1 behind the proxy, ocs2 behind none), and the real driver of ocs1 through it."""
    ends = twin.endpoints.devices["ocs1"]
    (tmp_path / "lab.yaml").write_text(LAB.format(visa=ends["visa"], api=ends["proxy_api"]))
    inventory = load_inventory(tmp_path / "lab.yaml").model
    driver = make_driver("polatis-scpi", "ocs1", inventory.devices["ocs1"].transport.settings())
    yield inventory, driver, ends
    driver.close()


def no_procedures(device: str, procedure: str, kwargs: dict):
    raise AssertionError(f"a transport fault on a lab calls no device procedure ({procedure} on {device})")


def timed_identify(driver) -> float:
    t0 = time.monotonic()
    driver.identify()
    return time.monotonic() - t0


def refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_latency_through_the_labs_toxiproxy_slows_the_device_and_heals(lab, ctl):
    inventory, driver, _ = lab
    env = FaultEnv(None, no_procedures, inventory)
    kind = FAULT_KINDS.get("transport.latency")
    target = ConnectionTarget("ocs1", "latency-1", "downstream", (("latency", 400),))  # integers, as Toxiproxy takes
    driver.identify()  # connected: the fault hits an open connection

    before = time.monotonic_ns()
    injected = kind.inject(env, target)
    assert before <= injected.at_ns <= time.monotonic_ns() and not injected.marked_by_device
    toxics = ctl.call("ocs1", "proxy.state")["toxics"]
    assert toxics == [
        {
            "name": "latency-1",
            "type": "latency",
            "stream": "downstream",
            "toxicity": 1.0,
            "attributes": {"latency": 400, "jitter": 0},
        }
    ]
    # Every reply 400 ms late, on the connection already open: a lower bound of the toxic's model, which a busy
    # machine cannot break (only lengthen).
    assert timed_identify(driver) >= 0.4

    kind.heal(env, target)
    # Healed is the lab's Toxiproxy holding no toxic (its own state), and the device answering again; how fast it
    # answers is the machine's pace, not an assertion (a loaded machine can take longer than any bound).
    assert ctl.call("ocs1", "proxy.state")["toxics"] == []
    assert driver.identify()


def test_down_refuses_connections_and_heal_brings_the_device_back(lab, ctl):
    inventory, driver, ends = lab
    env = FaultEnv(None, no_procedures, inventory)
    kind = FAULT_KINDS.get("transport.down")
    target = ConnectionTarget("ocs1", "down-1")
    driver.identify()

    kind.inject(env, target)
    assert ctl.call("ocs1", "proxy.state")["enabled"] is False
    assert refused(ends["tcp"])
    with pytest.raises(DeviceError, match="connection refused"):
        driver.identify()  # the open connection was cut, the next one is refused

    kind.heal(env, target)
    assert ctl.call("ocs1", "proxy.state")["enabled"] is True
    assert driver.identify()  # reconnected through the proxy


def test_a_lab_run_with_a_transport_fault_on_a_device_without_fault_proxy_is_refused_up_front(
    lab, repo, tmp_path, capsys
):
    playbook = tmp_path / "chaos.yaml"
    playbook.write_text(
        "name: chaos\ntrials: 1\nsteps:\n"
        "  - {action: fault.inject, fault: {kind: transport.latency, device: ocs1, attributes: {latency: 5}}}\n"
        "  - {action: fault.inject, fault: {kind: transport.down, device: ocs2}}\n"
    )
    results = tmp_path / "results"
    code = main(["run", str(playbook), "--inventory", str(tmp_path / "lab.yaml"), "--results", str(results), "--yes"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "error: transport.down: a lab breaks a device's connection through the Toxiproxy in front of it" in err
    assert 'the inventory gives ocs2 none; add fault_proxy: {api: "http://HOST:8474", proxy: NAME} to ocs2' in err
    assert "transport.latency" not in err  # on ocs1, which has its fault_proxy
    assert not results.exists()  # refused before a run folder exists

    # The kind says the same when driven directly on a device without one.
    env = FaultEnv(None, no_procedures, lab[0])
    with pytest.raises(FaultFailed, match=r"the inventory gives ocs2 none; add fault_proxy: "):
        FAULT_KINDS.get("transport.latency").inject(env, ConnectionTarget("ocs2", "latency-1"))


def test_heal_after_a_crash_removes_the_dead_runs_toxics_and_enables_the_proxy(lab, ctl):
    inventory, driver, ends = lab
    heal = HealDevices(inventory, recorder=None, control=None)  # a lab: no twin control
    api = ToxiproxyApi.of(inventory, "ocs1", "transport.latency")
    api.add_toxic("latency-3", "latency", "downstream", {"latency": 400})
    api.add_toxic("theirs", "slicer", "upstream", {"average_size": 4})  # someone else's: left alone
    api.set_enabled(False)

    def dead(kind: str, **data) -> ActiveFault:
        return ActiveFault(f"{kind}@ocs1", kind, "ocs1", {"kind": kind, "device": "ocs1", **data}, None, True)

    how = FAULT_KINDS.get("transport.latency").heal_after_crash(heal, dead("transport.latency", toxic="latency-3"))
    assert how == f"toxic latency-3 removed from proxy ocs1 through the Toxiproxy API at {ends['proxy_api']}"
    how = FAULT_KINDS.get("transport.down").heal_after_crash(heal, dead("transport.down", toxic="down-4"))
    assert how == f"proxy ocs1 enabled again through the Toxiproxy API at {ends['proxy_api']}"
    state = ctl.call("ocs1", "proxy.state")
    assert state["enabled"] is True and [t["name"] for t in state["toxics"]] == ["theirs"]
    how = FAULT_KINDS.get("transport.latency").heal_after_crash(heal, dead("transport.latency", toxic="latency-3"))
    assert how.startswith("toxic latency-3 was already gone")  # healed twice: nothing left to do
    assert driver.identify()


def test_the_apis_refusals_name_the_device_the_request_and_what_to_change(lab, ctl):
    inventory, _, ends = lab
    api = ToxiproxyApi.of(inventory, "ocs1", "transport.latency")
    with pytest.raises(FaultFailed) as bad:
        api.add_toxic("x", "gremlins", "downstream", {})
    message = str(bad.value)
    assert message.startswith(f"ocs1: the Toxiproxy API at {ends['proxy_api']}: sent POST {ends['proxy_api']}")
    assert '"type": "gremlins"' in message and "got HTTP 400: " in message and "check the fault's attributes" in message

    wrong = ToxiproxyApi("ocs1", ends["proxy_api"], "ocs9")
    with pytest.raises(FaultFailed, match=r"there is no proxy 'ocs9' on that server \(its proxies: ocs1\); set "):
        wrong.set_enabled(False)
    with pytest.raises(FaultFailed, match=r"there is no proxy 'ocs9'"):
        wrong.remove_toxic("latency-1")  # a toxic of a proxy that is not there is not "already gone"

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    nobody = ToxiproxyApi("ocs1", f"http://127.0.0.1:{port}", "ocs1")
    with pytest.raises(FaultFailed, match=r"got no answer: .*refused.*; check that Toxiproxy runs there"):
        nobody.set_enabled(True)


# --- a broken Toxiproxy: what its answers give ---------------------------------------------------------------


class Scripted(BaseHTTPRequestHandler):
    """Answers every request with the server's `answer` (status, body bytes, or "hang up")."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, body = self.server.answer
        if status is None:  # hang up without an answer
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def broken():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.answer = (200, b"{}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


TOXIC = {"name": "latency-1", "type": "latency", "stream": "downstream", "toxicity": 1.0, "attributes": {}}


@pytest.mark.parametrize(
    ("status", "body", "got"),
    [
        (200, b"<html>nginx</html>", "got HTTP 200 '<html>nginx</html>' (not JSON)"),
        (200, b"[1, 2]", "got '[1, 2]', not an object with name, type"),
        (409, b'"exists"', "got HTTP 409 '\"exists\"'; the server refused it; check the fault's attributes"),
        (200, b"\xff\xfe{", "(not JSON)"),
        (200, json.dumps({**TOXIC, "name": "other"}).encode(), "got HTTP 200 with toxic 'other' of type 'latency'"),
        (200, b"x" * (1024 * 1024 + 1), "got HTTP 200 with over 1048576 bytes"),
        (500, b'{"error": "boom", "status": 500}', "got HTTP 500: boom; the Toxiproxy server failed; look at its log"),
        (503, b"", "got HTTP 503 (no body)"),
        (None, b"", "got RemoteDisconnected"),
    ],
)
def test_a_malformed_answer_is_a_clear_error(broken, status, body, got):
    broken.answer = (status, body)
    api = ToxiproxyApi("ocs1", f"http://127.0.0.1:{broken.server_port}", "ocs1", timeout_s=5)
    with pytest.raises(FaultFailed) as failed:
        api.add_toxic("latency-1", "latency", "downstream", {"latency": 5})
    message = str(failed.value)
    assert message.startswith(f"ocs1: the Toxiproxy API at http://127.0.0.1:{broken.server_port}: sent POST ")
    assert got in message, message


def test_a_malformed_proxy_answer_is_a_clear_error(broken):
    api = ToxiproxyApi("ocs1", f"http://127.0.0.1:{broken.server_port}", "ocs1")
    broken.answer = (200, json.dumps({"name": "ocs1", "enabled": True}).encode())
    with pytest.raises(FaultFailed, match=r"got HTTP 200 with the proxy's enabled True, not False; the proxy did not"):
        api.set_enabled(False)
    broken.answer = (200, json.dumps({"name": "ocs1"}).encode())
    with pytest.raises(FaultFailed, match=r"not an object with name, enabled; .*fault_proxy.api is the Toxiproxy"):
        api.set_enabled(False)
    broken.answer = (200, json.dumps({"name": "ocs1", "enabled": True, "toxics": {}}).encode())
    with pytest.raises(FaultFailed, match=r"got toxics \{\}"):
        api.state()


def test_an_api_that_does_not_answer_in_time_is_a_clear_error():
    with socket.socket() as listening:  # accepts (the kernel's backlog) and never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        api = ToxiproxyApi("ocs1", f"http://127.0.0.1:{listening.getsockname()[1]}", "ocs1", timeout_s=0.3)
        with pytest.raises(FaultFailed, match=r"got no answer within 0.3 s; this is not a Toxiproxy API answer"):
            api.state()


@pytest.mark.parametrize(
    ("api", "why"),
    [
        ("ftp://127.0.0.1:8474", "an http:// or https:// address"),
        ("127.0.0.1:8474", "an http:// or https:// address"),
        ("http://127.0.0.1:99999", "the port is not a number from 1 to 65535"),
        ("http://user@127.0.0.1:8474", "no user, no query"),
        ("http://:8474", "no user, no query"),
    ],
)
def test_fault_proxy_api_must_be_an_http_url_said_at_its_line(tmp_path, api, why):
    (tmp_path / "lab.yaml").write_text(LAB.format(visa="TCPIP0::127.0.0.1::9::SOCKET", api=api))
    with pytest.raises(ConfigError) as bad:
        load_inventory(tmp_path / "lab.yaml")
    assert str(bad.value).startswith(f"{tmp_path / 'lab.yaml'}:8: devices.ocs1.fault_proxy.api: ")
    assert why in str(bad.value)


def test_fault_proxy_keeps_a_url_and_its_defaults(tmp_path):
    (tmp_path / "lab.yaml").write_text(LAB.format(visa="TCPIP0::127.0.0.1::9::SOCKET", api="https://tp.lab:8474/"))
    config = load_inventory(tmp_path / "lab.yaml").model.devices["ocs1"].fault_proxy
    assert (config.api, config.proxy, config.timeout_ms) == ("https://tp.lab:8474", "ocs1", 5000)
