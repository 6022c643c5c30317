"""What `bmc.ca_file` and the login do for a lab, against the twin's BMC served in this process with the
certificates a lab's BMCs come with (made at test time: tests/redfish/certs.py):

- a leaf a lab CA issued: verified against the CA (the standard chain), or pinned (the leaf itself in ca_file);
- a factory certificate that signed itself and is not a CA: pinned;
- the hostname is checked every time: a pinned certificate for another name is refused;
- the password never goes over plain http, and a BMC out of session slots is told so (and only then).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from certs import Issued, ca_issued, self_signed_leaf

from drivers.errors import DeviceCommandError, DeviceConnectionError
from drivers.redfish import RedfishBmc, RedfishSettings
from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.spec import GpuHostSpec
from emulators.redfish import RedfishServer
from emulators.redfish.service import MAX_SESSIONS

USER, PASSWORD = "admin", "tls-test-password"


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> GpuHostEngine:
    return GpuHostEngine(GpuHostSpec("gpu01", gpus=1), tmp_path_factory.mktemp("home"))


def serve(host: GpuHostEngine, tls: Issued) -> tuple[RedfishServer, str]:
    server = RedfishServer(certificate=(tls.chain, tls.key), ca_file=tls.ca)
    address = server.add("gpu01", host, USER, PASSWORD)["redfish"]
    server.start()
    return server, address


@pytest.fixture(scope="module")
def ca_bmc(host, tmp_path_factory) -> Iterator[tuple[str, Issued]]:
    tls = ca_issued(tmp_path_factory.mktemp("ca"))
    server, address = serve(host, tls)
    yield address, tls
    server.close()


def settings(address: str, ca_file: Path | str | None, **changes) -> RedfishSettings:
    base = {"address": address, "user": USER, "password": PASSWORD, "password_env": "LAB_BMC_PASSWORD"}
    return RedfishSettings(**{**base, "ca_file": str(ca_file) if ca_file else None, "timeout_s": 5.0, **changes})


def test_a_ca_issued_certificate_verifies_against_its_ca_and_pinned_as_itself(ca_bmc):
    address, tls = ca_bmc
    for ca_file in (tls.ca, tls.cert, tls.chain):  # the CA; the leaf, pinned; the chain as the BMC serves it
        with RedfishBmc(settings(address, ca_file), "gpu01") as bmc:
            assert bmc.power_state() == "On", ca_file


def test_a_ca_issued_certificate_without_its_ca_is_refused(ca_bmc, tmp_path):
    address, _ = ca_bmc
    other = ca_issued(tmp_path, prefix="other-")  # another lab's CA, and a leaf it issued for the same address
    for ca_file in (other.ca, other.cert):
        with pytest.raises(DeviceConnectionError) as err, RedfishBmc(settings(address, ca_file), "gpu01") as bmc:
            bmc.power_state()
        text = str(err.value)
        assert f"did not verify against bmc.ca_file {ca_file}" in text and "CERTIFICATE_VERIFY_FAILED" in text


def test_a_self_signed_factory_certificate_is_pinned(host, tmp_path):
    tls = self_signed_leaf(tmp_path)  # not a CA: only a pin can anchor it
    server, address = serve(host, tls)
    try:
        with RedfishBmc(settings(address, tls.cert), "gpu01") as bmc:
            assert bmc.power_state() == "On"
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["ca-issued", "self-signed"])
def test_the_hostname_is_checked_even_for_a_pinned_certificate(host, tmp_path, kind):
    make = ca_issued if kind == "ca-issued" else self_signed_leaf
    tls = make(tmp_path, hosts=("bmc7.lab.example",))  # a valid certificate, for another BMC's name
    server, address = serve(host, tls)
    try:
        for ca_file in {tls.ca, tls.cert}:
            with pytest.raises(DeviceConnectionError) as err, RedfishBmc(settings(address, ca_file), "gpu01") as b:
                b.power_state()
            assert "IP address mismatch" in str(err.value) or "hostname mismatch" in str(err.value)
    finally:
        server.close()


def test_a_ca_file_that_is_not_pem_names_the_file_and_sends_nothing(ca_bmc, tmp_path):
    address, _ = ca_bmc
    junk = tmp_path / "bmc-ca.pem"
    junk.write_text("not a certificate\n")
    audit = []
    with pytest.raises(DeviceConnectionError) as err, RedfishBmc(settings(address, junk), "gpu01", audit.append) as b:
        b.power_state()
    assert f"could not use the CA file {junk}" in str(err.value) and "bmc.ca_file" in str(err.value)
    assert audit == []


def test_plain_http_is_refused_before_anything_is_sent(tmp_path):
    """No Basic header and no login body over plain HTTP: the address is refused and nothing connects."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        address = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(DeviceConnectionError) as err, RedfishBmc(settings(address, None), "gpu01") as bmc:
            bmc.power_off()
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection was made
    text = str(err.value)
    assert text.startswith(f"gpu01 ({address}): the BMC's address {address} is plain http")
    assert "set bmc.address to the BMC's https address" in text


def test_a_bmc_out_of_session_slots_is_told_so_and_the_hint_names_slots_only_then(ca_bmc):
    address, tls = ca_bmc
    login = f"{address}/redfish/v1/SessionService/Sessions"
    others = []
    try:
        while len(others) < MAX_SESSIONS:  # other clients hold every slot
            answer = requests.post(login, json={"UserName": USER, "Password": PASSWORD}, verify=str(tls.ca), timeout=5)
            assert answer.status_code == 201
            others.append(answer.headers["Location"])
        with pytest.raises(DeviceCommandError) as err, RedfishBmc(settings(address, tls.ca), "gpu01") as bmc:
            bmc.power_state()
        text = str(err.value)
        assert "the BMC did not open a session" in text and "HTTP 503" in text
        assert "no free session slot: log out other clients" in text
    finally:
        for where in others:
            requests.delete(f"{address}{where}", auth=(USER, PASSWORD), verify=str(tls.ca), timeout=5)
    with RedfishBmc(settings(address, tls.ca), "gpu01") as bmc:  # slots freed: a session opens again
        assert bmc.power_state() == "On" and bmc.auth == "session"
    listed = requests.get(login, auth=(USER, PASSWORD), verify=str(tls.ca), timeout=5).json()
    assert listed["Members"] == [], json.dumps(listed)  # the driver logged out too
