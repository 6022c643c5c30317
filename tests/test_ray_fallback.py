"""A local Ray's quick start has a way back: where the installed Ray lacks or changed an internal it uses, the
session starts Ray with a plain ray.init instead, saying so once; where an internal it only patches is gone, that
part of the start is Ray's own and nothing else changes. The internals are removed and renamed in the head's
process by a sitecustomize module (Ray is the third party here: nothing of the project is replaced).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from testbed.engine.ray_local import (
    LOCAL_SYSTEM_CONFIG,
    TESTED_RAY,
    api_server_not_started,
    known_system_config,
    node_registration_polled,
)

REPO = Path(__file__).resolve().parent.parent

HOOK = """\
import importlib.abc, importlib.util, sys

MODULE, CHANGE = {module!r}, {change!r}


class _Changed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            exec(CHANGE, {{"module": module}})

        spec.loader.exec_module = exec_module
        return spec


if "testbed.engine.ray_local" in sys.orig_argv:  # the head's process only: the session's Ray stays whole
    sys.meta_path.insert(0, _Changed())
"""

SESSION = """\
from testbed.engine.ray_session import RayStart
start = RayStart(None, background=False)
ray = start.get()
print("up", ray.is_initialized(), ray.cluster_resources().get("CPU"), start.session_dir is not None)
start.shutdown()
"""


def session_with(tmp_path: Path, module: str, change: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(HOOK.format(module=module, change=change))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-c", SESSION], cwd=REPO, capture_output=True, text=True, timeout=180, env=env
    )


@pytest.mark.parametrize(
    ("module", "change", "missing"),
    [
        ("ray._private.node", "del module.Node", "ray._private.node"),  # removed
        (
            "ray._private.parameter",  # renamed: a keyword the start passes is not one RayParams takes now
            textwrap.dedent(
                """
                original = module.RayParams
                def RayParams(*args, include_log_monitor=None, **kwargs):
                    raise TypeError("RayParams() got an unexpected keyword argument 'include_log_monitor'")
                module.RayParams = RayParams
                """
            ),
            "include_log_monitor",
        ),
    ],
)
def test_a_ray_without_an_internal_the_quick_start_needs_starts_by_a_plain_ray_init(tmp_path, module, change, missing):
    done = session_with(tmp_path, module, change)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up True 2.0 False" in done.stdout  # a local instance, ours, with its session folder not named to heal
    said = [line for line in done.stderr.splitlines() if "started by a plain ray.init" in line]
    assert len(said) == 1 and missing in said[0], done.stderr


@pytest.mark.parametrize("where", ["missing", "renamed"])
def test_an_internal_the_quick_start_only_patches_is_left_alone_where_ray_has_it_no_more(where):
    """The API server's start and the node lookup are patched while the head starts; a Ray without them (gone, or
    under another name) is started as it is, and nothing is added to it.
    """
    node_cls = type("Node", (), {} if where == "missing" else {"start_the_api_server": lambda self: "Ray's"})
    services = types.SimpleNamespace(**({} if where == "missing" else {"node_lookup": lambda *a: "Ray's"}))
    fake = types.SimpleNamespace(
        _private=types.SimpleNamespace(node=types.SimpleNamespace(Node=node_cls), services=services)
    )
    with api_server_not_started(fake), node_registration_polled(fake):
        assert not hasattr(node_cls, "start_api_server") and not hasattr(services, "get_node")
    assert vars(services) == ({} if where == "missing" else {"node_lookup": services.node_lookup})


def _ray(version: str, binary: Path | None) -> types.SimpleNamespace:
    raylet = types.SimpleNamespace(__file__=str(binary)) if binary else None
    return types.SimpleNamespace(__version__=version, _raylet=raylet)


def test_only_system_config_keys_the_installed_ray_knows_are_passed(tmp_path):
    low, high = (".".join(map(str, v)) for v in TESTED_RAY)
    for tested in (f"{low}.0", f"{high}.0"):
        assert known_system_config(_ray(tested, None)) == LOCAL_SYSTEM_CONFIG  # every key known in the range
    keys = list(LOCAL_SYSTEM_CONFIG)
    binary = tmp_path / "_raylet.so"
    binary.write_bytes(b"\x00ELF..." + keys[0].encode() + b"\x00..." + keys[-1].encode() + b"\x00")
    newer = known_system_config(_ray(f"{TESTED_RAY[1][0]}.{TESTED_RAY[1][1] + 5}.0", binary))
    assert newer == {keys[0]: LOCAL_SYSTEM_CONFIG[keys[0]], keys[-1]: LOCAL_SYSTEM_CONFIG[keys[-1]]}


def test_the_installed_ray_knows_every_system_config_key_passed():
    import ray

    from testbed.engine.ray_local import names_in_ray

    assert names_in_ray(ray) == set(LOCAL_SYSTEM_CONFIG)  # were one unknown, Ray's processes would refuse to start
