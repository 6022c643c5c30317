"""Mutations of a real run's run.json and events.jsonl (every field's type: null, a boolean, huge and non-finite
numbers, strings, lists, objects, deep nesting, a key deleted; half of them in a history cut short, as a killed
runner leaves it) through `testbed check`, `testbed replay` and `testbed heal`: an exit code every time, never a
traceback. A seeded subset here; `python tests/run_folders/fuzz_run_folder.py RUN_DIR --mutations 1000` runs
the full fuzz.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_run_folder import fuzz, private_machine_state

MUTATIONS = 60


@pytest.fixture(scope="module")
def real_run(testbed_run, tmp_path_factory) -> Path:
    """A real emulated run with a fault, a job and the fabric: the events check and heal act on."""
    results = tmp_path_factory.mktemp("results")
    return testbed_run("playbooks/gpu-failover.yaml", "--emulate", "--trials", "1", "--results", str(results))


@pytest.mark.unchecked_history("mutated copies of a run: their histories are damaged on purpose")
@pytest.mark.timeout(600)
def test_mutated_run_folders_get_an_exit_code_never_a_traceback(real_run, tmp_path):
    with private_machine_state(tmp_path):
        outcome = fuzz(real_run, MUTATIONS, seed=37, work=tmp_path)
    assert outcome.tracebacks == []
    assert outcome.mutations == MUTATIONS and sum(outcome.exits.values()) == 3 * MUTATIONS
    assert outcome.exits.get(2, 0) > 0 and outcome.exits.get(0, 0) > 0  # refused some, and read others through
