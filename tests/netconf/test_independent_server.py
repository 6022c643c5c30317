"""The driver against a NETCONF server the project did not write: the `netconf` package's server (PyPI netconf 2.1.0,
netconf.server.NetconfSSHServer) carrying tests/netconf/polatis_peer.py's handler of the optical-switch model, in
its own process and its own virtual environment (its SSH layer needs paramiko < 4; docs/interop.md).

The peer's Python is TESTBED_NETCONF_PEER_PYTHON, else .venv-netconf-peer/bin/python in the repository (.ci/run
makes it: `python3 -m venv .venv-netconf-peer && .venv-netconf-peer/bin/pip install netconf==2.1.0 'paramiko<4'`).
Its host key is one the test makes and lists in a known_hosts file: the driver verifies it as it does a switch's.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nc_helpers import LIT, SIZE
from ncclient import manager
from peers import require_program
from yang_check import documents, yanglint

from drivers.errors import DeviceCommandError, DeviceConnectionError
from drivers.netconf.polatis import PolatisNetconf
from drivers.netconf.settings import NetconfSettings
from testbed.conformance import circuit_switch_suite

HERE = Path(__file__).parent
REPO = HERE.parents[1]
PASSWORD = "peer-password"
WHY = (
    "the independent NETCONF peer (PyPI netconf==2.1.0 with paramiko<4, in its own venv: "
    "python3 -m venv .venv-netconf-peer && .venv-netconf-peer/bin/pip install netconf==2.1.0 'paramiko<4')"
)


def peer_python() -> str:
    path = os.environ.get("TESTBED_NETCONF_PEER_PYTHON") or str(REPO / ".venv-netconf-peer" / "bin" / "python")
    return require_program(path, WHY)


class Peer:
    """polatis_peer.py running in the peer's Python: its port, known_hosts, transcript; stopped by close()."""

    def __init__(self, python: str, folder: Path, *, base10_only: bool) -> None:
        key = Ed25519PrivateKey.generate()
        host_key = folder / "host_key"
        host_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        self.public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        self.transcript = folder / "transcript.jsonl"
        args = [python, str(HERE / "polatis_peer.py"), "--host-key", str(host_key), "--size", str(SIZE)]
        args += ["--transcript", str(self.transcript)] + (["--base10-only"] if base10_only else [])
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PEER_PASSWORD": PASSWORD},
        )
        line = self.proc.stdout.readline()  # "port N" once it listens; nothing if it died
        if not line.startswith("port "):
            self.proc.kill()
            pytest.fail(f"the NETCONF peer did not start ({' '.join(args)}): {self.proc.stderr.read()}")
        self.port = int(line.split()[1])
        self.known_hosts = folder / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.public.decode()}\n")

    def settings(self, **kw) -> NetconfSettings:
        args = {"password": PASSWORD, "password_env": "PEER_PASSWORD", "known_hosts": str(self.known_hosts), **kw}
        return NetconfSettings("127.0.0.1", self.port, "admin", timeout_s=5.0, **args)

    def driver(self, audit=None, **kw) -> PolatisNetconf:
        return PolatisNetconf(self.settings(**kw), "peer-ocs", audit)

    def client(self) -> manager.Manager:
        """Another session, plain ncclient, on the same host key."""
        return manager.connect(
            host="127.0.0.1", port=self.port, username="admin", password=PASSWORD, allow_agent=False,
            look_for_keys=False, hostkey_verify=True, hostkey_b64=self.public.split()[1].decode(), timeout=10,
        )  # fmt: skip

    def messages(self) -> list[dict]:
        if not self.transcript.exists():
            return []
        return [json.loads(line) for line in self.transcript.read_text().splitlines()]

    def close(self) -> None:
        self.proc.stdin.close()  # the peer serves until its standard input closes
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _start(tmp_path_factory, framing: str) -> Peer:
    started = Peer(peer_python(), tmp_path_factory.mktemp("peer"), base10_only=framing == "1.0")
    started.framing = framing
    return started


@pytest.fixture(scope="module")
def chunked_peer(tmp_path_factory) -> Iterator[Peer]:
    started = _start(tmp_path_factory, "1.1")
    yield started
    started.close()


@pytest.fixture(scope="module")
def base10_peer(tmp_path_factory) -> Iterator[Peer]:
    started = _start(tmp_path_factory, "1.0")
    yield started
    started.close()


@pytest.fixture(params=["chunked_peer", "base10_peer"], ids=["chunked", "base10-only"])
def peer(request) -> Peer:
    return request.getfixturevalue(request.param)


def _driver(peer: Peer) -> Iterator[PolatisNetconf]:
    records: list = []
    driver = peer.driver(records.append)
    driver.disconnect_all()
    driver.set_port_enabled(range(1, 2 * SIZE + 1), True)
    assert f"base:{peer.framing} framing" in records[0].data  # the framing the driver noted as the session opened
    yield driver
    driver.close()


@pytest.fixture
def chunked_driver(chunked_peer) -> Iterator[PolatisNetconf]:
    yield from _driver(chunked_peer)


@pytest.fixture
def base10_driver(base10_peer) -> Iterator[PolatisNetconf]:
    yield from _driver(base10_peer)


@pytest.fixture
def peer_driver(peer) -> Iterator[PolatisNetconf]:
    yield from _driver(peer)


test_conformance_chunked = circuit_switch_suite("chunked_driver", size=SIZE, lit_ingress=sorted(LIT))
test_conformance_base10_only = circuit_switch_suite("base10_driver", size=SIZE, lit_ingress=sorted(LIT))


def test_the_framing_is_what_both_hellos_allow(peer):
    records: list = []
    with peer.driver(records.append) as driver:
        assert driver.connections() == {}
        assert driver.revision == "2018-03-22" and not driver.motion
    note = records[0].data
    assert f"base:{peer.framing} framing" in note
    assert ("urn:ietf:params:netconf:base:1.1" in note) == (peer.framing == "1.1")


def once_released(edit: Callable[[], None]) -> None:
    """Do `edit` once the peer has released a lock it said was released. The package answers an <unlock> (and ends a
    closing session) before it frees the lock (netconf 2.1.0's server sends the reply, then unlocks), so for a moment
    an edit from another session is still refused in-use: the driver's hint says to retry, and so does this. A lock
    never freed is pytest-timeout's to fail.
    """
    while True:
        try:
            return edit()
        except DeviceCommandError as refused:
            assert "in-use" in refused.message, refused  # refused for the lock, and for nothing else


def test_a_lock_held_by_another_session(peer):
    records: list = []
    holder = peer.client()
    try:
        with peer.driver(records.append) as driver:
            driver.disconnect_all()
            holder.lock(target="running")
            with pytest.raises(DeviceCommandError) as info:
                driver.connect([(1, 9)])
            err = info.value
            # the peer sends in-use with no error-info (RFC 6241 Appendix A); the driver asks with a <lock>,
            # which the package refuses with lock-denied and the holder's session-id
            assert "in-use" in err.message and "<error-info>" not in err.received
            assert f"running is locked by NETCONF session {holder.session_id}" in err.hint
            assert "circuit" not in err.hint
            assert driver.connections() == {}  # nothing changed
            holder.unlock(target="running")
            once_released(lambda: driver.connect([(1, 9)]))
            assert driver.connections() == {1: 9}
            holder.lock(target="running")
            holder.close_session()  # the package releases a closing session's lock
            holder = None
            once_released(lambda: driver.disconnect([(1, 9)]))
            assert driver.connections() == {}
    finally:
        if holder is not None:
            holder.close_session()


def test_rpc_errors_become_device_errors_with_matching_hints(peer_driver):
    peer_driver.connect([(1, 9)])
    with pytest.raises(DeviceCommandError) as info:
        peer_driver.connect([(2, 9)])  # egress 9 carries ingress 1's circuit
    assert "in-use" in info.value.message and "disconnect the circuit" in info.value.hint
    with pytest.raises(DeviceCommandError) as info:
        peer_driver.connect([(2, 99)])
    assert "invalid-value" in info.value.message and f"egress {SIZE + 1}..{2 * SIZE}" in info.value.hint
    with pytest.raises(DeviceCommandError) as info:
        peer_driver.disconnect([(3, 11)])
    assert "data-missing" in info.value.message and "connections()" in info.value.hint
    assert peer_driver.connections() == {1: 9}  # every refusal changed nothing


def test_the_host_key_is_verified(peer, tmp_path):
    other = Ed25519PrivateKey.generate().public_key()
    line = other.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{peer.port} {line}\n")
    with pytest.raises(DeviceConnectionError) as info:
        peer.driver(known_hosts=str(wrong)).connections()
    assert f"does not match the one in {wrong}" in info.value.message
    assert paramiko.HostKeys(str(peer.known_hosts)).lookup(f"[127.0.0.1]:{peer.port}")  # the right one is listed


def test_what_the_peer_received_is_valid_yang(peer):
    lint = require_program("yanglint", "yanglint (Debian libyang2-tools) validates the RPCs against the YANG")
    before = len(peer.messages())
    with peer.driver() as driver:
        driver.identify()
        driver.disconnect_all()
        driver.connect([(1, 9), (2, 10)])
        driver.wait_settled()
        driver.connections()
        driver.port_power([9, 10])
        driver.port_states([9])
        driver.set_port_enabled([10], False)
        driver.set_port_enabled([10], True)
        driver.disconnect([(1, 9), (2, 10)])
    problems = []
    names = set()
    for exchange in peer.messages()[before:]:
        name, docs = documents(exchange["rpc"], exchange["reply"])
        names.add(name)
        problems += [p for doc in docs if (p := yanglint(lint, doc)) is not None]
    assert not problems, "\n".join(problems)
    assert {"get", "get-config", "edit-config", "port-set-state"} <= names
