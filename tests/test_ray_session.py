"""Which --ray-address values are this machine's loopback: for those, Ray must run in single-machine mode, or
it rewrites 127.0.0.1 to the machine's outward address, where the cluster does not listen, and retries for
minutes."""

from __future__ import annotations

import pytest

from testbed.runner.ray_session import _loopback


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1:6379", True),
        ("127.0.1.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("10.0.0.5:6379", False),
        ("head.lab.example:6379", False),
        ("ray://head.lab.example:10001", False),
        ("auto", False),
    ],
)
def test_loopback_addresses_are_recognised(address, loopback):
    assert _loopback(address) is loopback
