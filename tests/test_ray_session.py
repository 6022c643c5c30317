"""Which --ray-address values are this machine's loopback: for those, Ray must run in single-machine mode, or
it rewrites 127.0.0.1 to the machine's outward address, where the cluster does not listen, and retries for
minutes.
"""

from __future__ import annotations

import pytest

from testbed.engine.ray_session import _loopback


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


def test_a_local_instance_starts_without_rays_fixed_waits(ray_cluster):
    """The session's instance is started as `testbed run` starts one: its raylet retries its object store every
    20 ms (not every second, for the same 10 s), starts no workers ahead for the first driver, and Ray's own node
    lookup is back in place once it is up.
    """
    from ray._private import services

    from testbed.engine.ray_local import LOCAL_SYSTEM_CONFIG

    config = ray_cluster._private.state.state.get_system_config()
    assert {k: config.get(k) for k in LOCAL_SYSTEM_CONFIG} == LOCAL_SYSTEM_CONFIG
    # Ray adds its own keys (object spilling) to the dict it is given: ours stays as it is, or the next local
    # start in this process (a second Lab) would pass them back and Ray would warn about them
    assert set(LOCAL_SYSTEM_CONFIG) == {
        "raylet_client_connect_timeout_milliseconds",
        "raylet_client_num_connect_attempts",
        "prestart_worker_first_driver",
    }
    assert services.get_node.__module__ == "ray._private.services"  # ours only while Ray starts


def test_the_polled_wait_answers_for_a_registered_node(ray_cluster):
    """The wait that replaces Ray's one-second sleeps finds a node that is up and lets Ray's own lookup answer."""
    from ray._private import services

    from testbed.engine.ray_local import node_registration_polled

    node = ray_cluster._private.worker._global_node
    with node_registration_polled(ray_cluster):
        assert services.get_node.__module__ == "testbed.engine.ray_local"
        info = services.get_node(node.gcs_address, node.node_id)
    assert info["node_id"] == node.node_id
    assert info["node_manager_port"] > 0
