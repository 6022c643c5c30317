"""Host keys are verified: a switch whose key is not the one known_hosts lists, or is not listed at all, is refused
with a DeviceConnectionError that names the file and the host:port, before anything is sent to it.
"""

from __future__ import annotations

import paramiko
import pytest
from nc_helpers import settings_for
from ncclient import manager
from ncclient.transport.errors import SSHUnknownHostError

from drivers.errors import DeviceConnectionError
from drivers.netconf.polatis import PolatisNetconf


def _known_hosts(tmp_path, lines: list[str]) -> str:
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def _name(ends: dict) -> str:
    host, _, port = ends["netconf"].rpartition(":")
    return f"[{host}]:{port}"


def test_a_changed_host_key_is_refused(twin_ends, tmp_path):
    impostor = paramiko.Ed25519Key.from_private_key_file(twin_ends["key_file"])  # any other ed25519 key
    known = _known_hosts(tmp_path, [f"{_name(twin_ends)} ssh-ed25519 {impostor.get_base64()}"])
    records: list = []
    driver = PolatisNetconf(settings_for(twin_ends, known_hosts=known), "ocs1", records.append)
    with pytest.raises(DeviceConnectionError) as info:
        driver.connections()
    err = info.value
    assert f"the host key of {_name(twin_ends)} does not match the one in {known}" in err.message
    assert "ssh-keygen" in err.hint and known in err.hint
    assert not [r for r in records if r.direction == "tx"]  # nothing was sent


def test_an_unknown_host_is_refused_before_connecting(twin_ends, tmp_path):
    some_key = paramiko.Ed25519Key.from_private_key_file(twin_ends["key_file"]).get_base64()
    other = _known_hosts(tmp_path, [f"[127.0.0.1]:1 ssh-ed25519 {some_key}"])  # another host only
    for known in (other, str(tmp_path / "missing_known_hosts")):
        with pytest.raises(DeviceConnectionError) as info:
            PolatisNetconf(settings_for(twin_ends, known_hosts=known), "ocs1").identify()
        assert f"the host key of {_name(twin_ends)} is not in {known}" in info.value.message
        assert "ssh-keyscan" in info.value.hint


def test_the_twins_known_hosts_is_accepted(twin_ends):
    with PolatisNetconf(settings_for(twin_ends), "ocs1") as driver:
        assert driver.connections() == {}


def test_ncclient_itself_refuses_a_wrong_hostkey_b64(twin_ends):
    impostor = paramiko.Ed25519Key.from_private_key_file(twin_ends["key_file"])
    host, _, port = twin_ends["netconf"].rpartition(":")
    with pytest.raises(SSHUnknownHostError):
        manager.connect(
            host=host, port=int(port), username="admin", key_filename=twin_ends["key_file"], allow_agent=False,
            look_for_keys=False, hostkey_verify=True, hostkey_b64=impostor.get_base64(), timeout=5,
        )  # fmt: skip
