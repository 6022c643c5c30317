"""A GPU host's name becomes a kernel name under --netns (its namespace, testbed-<tag>-<host>, a file under /run/netns):
`testbed validate` refuses one too long for it, at its line, instead of the twin failing with "File name too long".
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from emulators.netns import TAG_LEN, ns_name
from testbed.documents.checks import MAX_HOST_NAME, NETNS_NAME_MAX

INVENTORY = """\
name: long-names
devices:
  {host}: {{kind: gpu_host, driver: ssh, transport: {{type: ssh, host: gpu01.lab.example, user: lab}}, ports: [p0]}}
  ocs1:
    {{kind: ocs, driver: polatis-scpi, transport: {{type: visa, resource: "TCPIP0::10.0.0.5::5025::SOCKET"}}, size: 8}}
"""


def validate(repo, tmp_path, host: str) -> subprocess.CompletedProcess:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY.format(host=host))
    return subprocess.run(
        [sys.executable, "-m", "testbed", "validate", str(path)], cwd=repo, capture_output=True, text=True
    )


def test_a_host_name_too_long_for_its_namespace_is_refused_at_validate_with_its_line(repo, tmp_path):
    refused = validate(repo, tmp_path, "g" * (MAX_HOST_NAME + 1))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    out = refused.stdout + refused.stderr
    assert f"inventory.yaml:3: devices.{'g' * (MAX_HOST_NAME + 1)}: a GPU host's name is at most {MAX_HOST_NAME}" in out
    assert "Traceback" not in out
    longest = validate(repo, tmp_path, "g" * MAX_HOST_NAME)
    assert longest.returncode == 0, longest.stdout + longest.stderr


def test_the_longest_host_name_makes_the_longest_namespace_name():
    assert len(ns_name("f" * TAG_LEN, "g" * MAX_HOST_NAME)) == NETNS_NAME_MAX  # the netns code's own derivation


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_the_kernel_takes_the_longest_namespace_name():
    name = ns_name("f" * TAG_LEN, "g" * MAX_HOST_NAME)
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    try:
        assert made.returncode == 0, made.stderr
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
