"""`testbed check` passes a real run and catches each kind of broken history."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.cli.main import main
from testbed.contracts.errors import UserError
from testbed.ops.check import check_run

pytestmark = pytest.mark.unchecked_history("its tests damage a run's history on purpose")


@pytest.fixture(scope="module")
def run_dir(ray_cluster, repo, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    assert (
        main(
            [
                "run",
                str(repo / "playbooks/ocs-reconfig.yaml"),
                "--emulate",
                "--trials",
                "2",
                "--results",
                str(results),
                "--inventory",
                str(repo / "playbooks/inventory/emulated-rack.yaml"),
            ]
        )
        == 0
    )
    return next(results.iterdir())


def tampered(run_dir: Path, tmp_path: Path, file: str, edit) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    lines = [json.loads(line) for line in (copy / file).read_text().splitlines()]
    (copy / file).write_text("".join(json.dumps(x) + "\n" for x in edit(lines)))
    return copy


def test_a_real_run_passes_every_check(run_dir, capsys):
    assert check_run(run_dir).ok
    assert main(["check", str(run_dir)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["ok"] * 6


def test_an_operation_without_its_completion_is_caught(run_dir, tmp_path):
    def drop_last_ok(events):
        last = max(i for i, e in enumerate(events) if e["type"] == "ok" and e["op"] == "ocs.reconfigure")
        return events[:last] + events[last + 1 :]

    result = check_run(tampered(run_dir, tmp_path, "events.jsonl", drop_last_ok))
    assert any(
        "never closed" in p or "closes no invoke" in p or "open invoke" in p
        for p in result.checks["every invoke closed"]
    )


def test_a_write_to_a_reserved_port_is_caught(run_dir, tmp_path):
    def add_write(audit):
        forged = dict(audit[-1], direction="tx", data=":OXC:SWIT:CONN:ADD (@31),(@63)")
        return [*audit, forged]

    result = check_run(tampered(run_dir, tmp_path, "audit.jsonl", add_write))
    assert any("[31, 63]" in p for p in result.checks["writes within the inventory's interlocks"])
    # And the forged circuit is not on the switch: the fabric check sees the history disagree too.
    assert result.checks["final fabric matches history"]


def test_a_switch_changed_behind_the_runs_back_is_caught(run_dir, tmp_path):
    def extra_circuit(events):
        for e in events:
            if e["op"] == "fabric.final":
                e["data"]["circuits"]["ocs1"]["5"] = 40
        return events

    result = check_run(tampered(run_dir, tmp_path, "events.jsonl", extra_circuit))
    assert any("present but not implied [(5, 40)]" in p for p in result.checks["final fabric matches history"])


def test_check_on_a_folder_that_is_not_a_run_is_bad_input(tmp_path, capsys):
    assert main(["check", str(tmp_path)]) == 2
    assert "not a readable run folder" in capsys.readouterr().err


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(["seq", "type", "op", "mono_ns", "wall", "run", "trial", "step", "device", "data"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    line=st.integers(min_value=0),
    where=st.one_of(_keys.map(lambda k: (k,)), st.tuples(st.just("data"), st.text(max_size=8))),
    value=_json,
    raw=st.sampled_from([None, "[" * 5000 + "]" * 5000, '{"seq": "sixty"}', "not json", "{}", "[]"]),
)
def test_any_damage_to_a_history_is_a_clear_error_or_a_finding(run_dir, line, where, value, raw):
    """`testbed check` answers every damaged history with a finding or a clear error naming the file and line:
    never with a traceback.
    """
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "run"
        shutil.copytree(run_dir, copy)
        lines = (copy / "events.jsonl").read_text().splitlines()
        i = line % len(lines)
        if raw is not None:
            lines[i] = raw
        else:
            event = json.loads(lines[i])
            target = event
            for key in where[:-1]:
                target = target.setdefault(key, {}) if isinstance(target.get(key, {}), dict) else {}
            target[where[-1]] = value
            lines[i] = json.dumps(event)
        (copy / "events.jsonl").write_text("\n".join(lines) + "\n")
        try:
            check_run(copy)
        except UserError as exc:
            assert str(exc)


def test_a_seq_that_is_not_a_number_names_its_line(run_dir, tmp_path):
    def damage(events):
        events[3]["seq"] = "sixty"
        return events

    with pytest.raises(UserError, match=r"events.jsonl:4: 'seq' is \"sixty\", not an integer"):
        check_run(tampered(run_dir, tmp_path, "events.jsonl", damage))
