"""DMTF's own Redfish client library, used directly (not through our driver), against the twin's emulated BMC:
what any Redfish tool a lab already has would do. A session login, the standard walk from the service root
to the ComputerSystem, the Reset action with the values the system advertises, HTTP Basic instead of a
session, and a logout that frees the session.
"""

from __future__ import annotations

import json
import os

import redfish
from bmc_twin import endpoints, ssh_settings

from emulators.frontends import TWIN_PASSWORD
from testbed.families.drivers import make_driver


def client(ep: dict):
    return redfish.redfish_client(
        base_url=ep["redfish"],
        username=ep["redfish_user"],
        password=TWIN_PASSWORD,
        cafile=ep["redfish_ca"],  # the twin's certificate: verified, not ignored
        timeout=5,
        max_retry=0,
    )


def test_unmodified_client_session_login_walks_to_the_system_and_resets_it(twin, ctl):
    ep = endpoints(twin)
    ssh = make_driver("ssh", "gpu01", ssh_settings(ep))
    job = ssh.run_job(["sleep", "60"], name="rank0.0", gpus=[0])
    ssh.close()
    c = client(ep)
    c.login(auth="session")
    try:
        assert c.get_session_key()  # X-Auth-Token
        systems_link = c.root["Systems"]["@odata.id"]
        members = c.get(systems_link).dict["Members"]
        assert [m["@odata.id"] for m in members] == ["/redfish/v1/Systems/1"]
        system = c.get(members[0]["@odata.id"]).dict
        assert system["PowerState"] == "On"
        action = system["Actions"]["#ComputerSystem.Reset"]
        assert {"On", "ForceOff"} <= set(action["ResetType@Redfish.AllowableValues"])

        off = c.post(action["target"], body={"ResetType": "ForceOff"})
        assert off.status == 204
        assert c.get(members[0]["@odata.id"]).dict["PowerState"] == "Off"
        assert not os.path.exists(f"/proc/{job.pid}")  # the host's processes died with its power
        assert ctl.call("gpu01", "state")["powered"] is False

        on = c.post(action["target"], body={"ResetType": "On"})
        assert on.status == 204
        assert c.get(members[0]["@odata.id"]).dict["PowerState"] == "On"
        sessions = c.get("/redfish/v1/SessionService/Sessions").dict["Members"]
        assert {"@odata.id": c.get_session_location()} in sessions
    finally:
        c.logout()
    # Logged out: the token no longer opens anything.
    token_client = redfish.redfish_client(
        base_url=ep["redfish"], sessionkey="0" * 32, cafile=ep["redfish_ca"], timeout=5, max_retry=0
    )
    assert token_client.get("/redfish/v1/Systems/1").status == 401
    assert ctl.call("gpu01", "state")["powered"] is True


def test_unmodified_client_with_http_basic_and_its_error_messages(twin, ctl):
    ep = endpoints(twin)
    c = client(ep)
    c.login(auth="basic")
    target = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
    bad = c.post(target, body={"ResetType": "Explode"})
    assert bad.status == 400
    info = bad.dict["error"]["@Message.ExtendedInfo"][0]
    assert info["MessageId"] == "Base.1.8.ActionParameterValueNotInList"
    assert "'Explode'" in info["Message"] and info["Resolution"]
    assert c.get("/redfish/v1/Chassis/1").status == 404
    assert c.post(target, body={"ResetType": "ForceRestart"}).status == 204  # off and on again
    assert ctl.call("gpu01", "state")["powered"] is True
    c.logout()


def test_the_commands_testbed_emulate_prints_for_a_bmc_work_as_printed(twin, ctl):
    """`testbed emulate` prints, for each host, how to reach its BMC with ordinary tools: the redfish library's
    one-liner and curl, both verifying the twin's certificate.
    """
    import shutil
    import subprocess
    import sys

    from testbed.twin.standalone import endpoint_lines

    lines = {
        line.split(": ", 1)[0]: line.split(": ", 1)[1]
        for line in endpoint_lines(endpoints(twin))
        if line.startswith("redfish")
    }
    assert set(lines) == {"redfish", "redfish (curl)"}
    python = lines["redfish"].replace("python3", f'"{sys.executable}"', 1)
    done = subprocess.run(python, shell=True, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "On\n"), done.stderr
    if shutil.which("curl"):
        done = subprocess.run(lines["redfish (curl)"], shell=True, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout)["PowerState"] == "On", done.stderr
