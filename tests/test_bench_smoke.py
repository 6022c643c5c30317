"""The fan-out benchmark's baselines talk to the emulated hosts as they would to real ones: OpenSSH with a
forced terminal (`ssh -tt`, what Ansible's `raw` module asks for) and Ansible itself, host keys checked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulators.gpuhost.spec import GpuHostSpec
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import health_fanout  # noqa: E402


@pytest.fixture(scope="module")
def hosts():
    with TwinProcess(TwinSpec(devices=[GpuHostSpec(name="h001", gpus=2), GpuHostSpec(name="h002", gpus=2)])) as twin:
        yield twin.endpoints.devices


def test_openssh_with_a_forced_terminal_sees_what_a_tty_shows(hosts):
    if shutil.which("ssh") is None:
        pytest.skip("the OpenSSH client (ssh) is not installed")
    ep = hosts["h001"]
    _, port = ep["ssh"].rsplit(":", 1)
    r = subprocess.run(
        ["ssh", "-F", "/dev/null", "-tt", "-p", port, "-i", ep["key_file"]]
        + ["-o", f"UserKnownHostsFile={ep['known_hosts']}", "-o", "StrictHostKeyChecking=yes"]
        + ["-o", "BatchMode=yes", f"{ep['user']}@127.0.0.1", "hostname; cat missing"],
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 1, r.stderr
    # one terminal for both streams, with the tty's CR LF line ends
    assert r.stdout == b"h001\r\ncat: missing: No such file or directory\r\n"


def test_ansible_raw_runs_the_health_commands_on_every_emulated_host(hosts, tmp_path):
    binary = health_fanout.ansible_binary()
    if binary is None:
        pytest.skip("ansible is not installed (pip install -e '.[bench]')")
    inventory = health_fanout.ansible_inventory(hosts, tmp_path / "hosts.ini")
    env = health_fanout.ansible_env(tmp_path / "cp", tmp_path / "home")
    seconds = health_fanout.ansible_once(binary, inventory, 2, env, len(hosts), tmp_path)
    assert seconds > 0


def test_ansible_refuses_a_host_whose_key_it_does_not_know(hosts, tmp_path):
    binary = health_fanout.ansible_binary()
    if binary is None:
        pytest.skip("ansible is not installed (pip install -e '.[bench]')")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    strangers = {name: {**ep, "known_hosts": str(empty)} for name, ep in hosts.items()}
    inventory = health_fanout.ansible_inventory(strangers, tmp_path / "hosts.ini")
    env = health_fanout.ansible_env(tmp_path / "cp", tmp_path / "home")
    with pytest.raises(RuntimeError, match="0 of 2 hosts answered rc=0") as info:
        health_fanout.ansible_once(binary, inventory, 2, env, len(hosts), tmp_path)
    assert "Host key verification failed" in str(info.value)


def test_the_command_to_table_on_the_lab_is_a_lab_run_on_hosts_that_are_up(hosts, tmp_path):
    """The fan-out benchmark's "on the lab" figure: `testbed run` without --emulate, from the inventory a lab would
    write for hosts that are up already (the running twin's addresses, keys and known_hosts).
    """
    import json

    lab = health_fanout.lab_inventory(hosts, tmp_path / "lab.yaml")
    run = health_fanout.with_testbed(lab, tmp_path / "results", 1, emulate=False)
    assert len(run["steps_s"]) == 1 and 0 < run["steps_s"][0] < run["cold_s"]
    folder = next((tmp_path / "results").iterdir())
    info = json.loads((folder / "run.json").read_text())
    assert info["emulate"] is False and "twin" not in info["startup_s"]
    assert set(info["startup_s"]) >= {"ray", "leases", "hubs", "identify"}


def test_the_inventory_load_benchmark_compares_the_same_lab_both_ways():
    import inventory_load

    figures = inventory_load.measure(rounds=1)  # raises if the shorthand file and the plain one differ
    assert figures["plain_lines"] > 100 * figures["shorthand_lines"]  # the plain file is the lab written out
    assert {name: set(phases) for name, phases in figures["p50_s"].items()} == {
        "shorthand": {"load_s", "total_s"},
        "plain": {"load_s", "total_s"},
    }
