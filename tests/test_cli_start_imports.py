"""What `testbed run` loads before Ray's head starts: the head begins once the command has parsed its arguments, and
every module loaded before that delays the whole start (docs/tuning.md, "A command's start"). The catalog's queries
and gate (numpy, the device families) are for `testbed runs`, `trend` and `gate`, not for parsing a command line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import testbed.catalog


def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(out.stdout.split())


def test_parsing_a_run_loads_neither_the_catalog_queries_nor_numpy_nor_the_families():
    loaded = _loaded_after(
        "from testbed.cli.main import build_parser\n"
        "build_parser().parse_args(['run', 'playbooks/gpu-health.yaml', '--emulate', '--tag', 'a', '--note', 'b'])"
    )
    assert "testbed.cli.main" in loaded
    assert not {"numpy", "testbed.catalog.query", "testbed.catalog.gate", "testbed.families", "ray"} & loaded


def test_the_gate_command_still_names_its_selection_words_and_default_limit():
    from testbed.catalog import gate
    from testbed.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["gate", "span", "--candidate", "tag=after"])
    assert args.max_slowdown == gate.DEFAULT_MAX_SLOWDOWN_PCT
    assert "owner" in gate.KEYS and "tag" in gate.KEYS


def test_every_catalog_name_loads_on_first_use():
    for name in testbed.catalog.__all__:
        assert callable(getattr(testbed.catalog, name)) or isinstance(getattr(testbed.catalog, name), type)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        testbed.catalog.nothing  # noqa: B018
