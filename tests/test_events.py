"""The event log is the results format: one schema (documented in results/README.md, generated from it), checked
on every event the recorder writes, and one reader with one rule for a torn last line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.events import JsonlError, Op, read_jsonl, set_aside_torn_line
from testbed.events.docs import BEGIN, END, FIELD_DOCS, render_event_docs
from testbed.events.schema import SCHEMA, Measure, OperationFailed, OperationOk, SchemaError, check_event
from testbed.families import PROCEDURES
from testbed.results.recorder import Recorder

REPO = Path(__file__).resolve().parent.parent


def test_results_readme_documents_the_schema_as_it_is():
    text = (REPO / "results/README.md").read_text()
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    rewrite = "python -m testbed.results.event_tables --readme results/README.md"
    assert block == render_event_docs(PROCEDURES.marks()), f"run: {rewrite}"


def test_every_framework_event_is_specified_and_every_field_documented():
    assert set(SCHEMA) == {str(op) for op in Op}
    payloads = [s.payload for s in SCHEMA.values()] + [Measure, OperationOk, OperationFailed]
    fields = {k for p in payloads for k in p.__annotations__}
    assert fields <= set(FIELD_DOCS), sorted(fields - set(FIELD_DOCS))
    assert set(FIELD_DOCS) <= fields, sorted(set(FIELD_DOCS) - fields)  # no doc for a field nothing has


def test_every_procedure_declares_its_marks():
    assert set(PROCEDURES) == set(PROCEDURES.marks()) and len(PROCEDURES) > 10


def check(type_, op, data=None, device=None):
    check_event(type_, op, data or {}, device=device, procedures=PROCEDURES.marks())


def test_the_schema_accepts_what_the_framework_writes():
    check("mark", Op.TRIAL_END, {"status": "failed", "error": "x"})
    check("mark", "sent", device="ocs1")  # a procedure's device mark
    check("mark", Op.FAULT_INJECTED, device="gpu01")  # a device mark that is also a milestone (gpu.kill_job)
    check("mark", Op.FAULT_INJECTED, {"fault": "gpu.fail@rank1", "kind": "gpu.fail", "rank": 1}, device="gpu01")
    check("invoke", "ocs.reconfigure", {"circuits": "12 items"}, device="ocs1")
    check("ok", "ocs.reconfigure", {"value": {"added": 2}, "duration_ms": 27.0}, device="ocs1")
    check("info", "ocs.reconfigure", {"error": "outcome unknown", "audit_lost": True}, device="ocs1")
    check("measure", "reconfig.total", {"ms": 1.0, "start_ns": 1, "end_ns": 1_000_001})


@pytest.mark.parametrize(
    ("type_", "op", "data", "device", "why"),
    [
        ("mark", "trial.ended", {"status": "ok"}, None, "not in testbed/events/schema.py"),
        ("ok", Op.TRIAL_END, {"status": "ok"}, None, "is a mark, not a ok"),
        ("mark", Op.TRIAL_END, {}, None, r"misses \['status'\]"),
        ("mark", Op.TRIAL_END, {"status": "ok", "stauts": 1}, None, r"has no field \['stauts'\]"),
        ("mark", Op.FABRIC_OBSERVED, {"circuits": {}, "audit_line": 0, "why": ""}, None, "needs device"),
        ("mark", "sent", {}, None, "not in testbed/events/schema.py"),  # a device mark names its device
        ("ok", "ocs.reconfigure", {"valeu": 1}, "ocs1", "misses"),
        ("measure", "reconfig.total", {"ms": 1.0}, None, "misses"),
    ],
)
def test_the_schema_refuses_what_it_does_not_define(type_, op, data, device, why):
    with pytest.raises(SchemaError, match=why):
        check(type_, op, data, device)


def test_the_recorder_refuses_an_event_outside_the_schema_under_test(tmp_path):
    recorder = Recorder(tmp_path, "run")
    try:
        recorder.emit("mark", Op.RUN_START, data={"trials": 1, "seed": 0})
        with pytest.raises(SchemaError):
            recorder.emit("mark", "run.begin", data={})
    finally:
        recorder.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["run.start"]  # the refused one was not written


def test_a_torn_last_line_is_left_out_and_reported(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"seq": 1}\n{"seq": 2}\n{"seq": 3, "op": "run')
    read = read_jsonl(path)
    assert [r["seq"] for r in read.records] == [1, 2] and read.lines == [1, 2]
    assert "last line is torn" in read.torn
    assert "set aside" in set_aside_torn_line(path)
    assert read_jsonl(path).torn is None and (tmp_path / "events.jsonl.torn").read_bytes() == b'{"seq": 3, "op": "run\n'


def test_damage_a_kill_cannot_explain_names_the_file_and_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"seq": 1}\n{"seq": 2\n{"seq": 3}\n')
    with pytest.raises(JsonlError, match=r"audit\.jsonl:2: not a JSON line"):
        read_jsonl(path)
    path.write_bytes(b'{"seq": 1}\n[1, 2]\n')
    with pytest.raises(JsonlError, match=r"audit\.jsonl:2: a JSON list, not an object"):
        read_jsonl(path)


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"seq": 1}\n{"seq": 2}')
    read = read_jsonl(path)
    assert [r["seq"] for r in read.records] == [1, 2] and read.torn is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.just(b'{"a": 1}'), st.just(b"")), max_size=8), st.booleans())
def test_any_bytes_give_records_or_a_located_error(tmp_path_factory, chunks, final_newline):
    path = tmp_path_factory.mktemp("fuzz") / "events.jsonl"
    path.write_bytes(b"\n".join(chunks) + (b"\n" if final_newline else b""))
    try:
        read = read_jsonl(path)
    except JsonlError as exc:
        assert str(exc).startswith(f"{path}:")
        return
    assert all(isinstance(r, dict) for r in read.records)
    assert len(read.records) == len(read.lines)
