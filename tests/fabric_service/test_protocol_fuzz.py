"""The fabric service's parser takes any bytes: a typed request (or answer), or a ProtocolError, never another
exception; what the encoder writes, the parser reads back unchanged.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostside.fabric_protocol import (
    MAX_LINE,
    Answer,
    Hello,
    Prepare,
    ProtocolError,
    Release,
    Setup,
    encode,
    parse_answer,
    parse_request,
)

REQUESTS = (Hello, Setup, Prepare, Release)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
names = st.text(min_size=1, max_size=40)
ids = st.text(min_size=1, max_size=20) | st.integers(-(2**63), 2**63 - 1)
nonneg = st.integers(0, 2**70)


@st.composite
def valid_requests(draw) -> dict:
    op = draw(st.sampled_from(["hello", "setup", "prepare", "release"]))
    if op == "hello":
        return {"op": op, "token": draw(names), "rank": draw(nonneg)}
    wire = {"op": op, "config": draw(names), "id": draw(ids)}
    if op == "setup" or draw(st.booleans()):
        wire["t_job_ns"] = draw(nonneg)
    return wire


@st.composite
def damaged_requests(draw) -> dict:
    """A valid request with one field dropped, retyped, or added."""
    wire = draw(valid_requests())
    how = draw(st.sampled_from(["drop", "retype", "add"]))
    key = draw(st.sampled_from(sorted(wire)))
    if how == "drop":
        del wire[key]
    elif how == "retype":
        wire[key] = draw(json_values)
    else:
        wire[draw(st.text(max_size=10))] = draw(json_values)
    return wire


def parsed_or_refused(line) -> None:
    try:
        request = parse_request(line)
    except ProtocolError as e:
        assert str(e)
        return
    assert isinstance(request, REQUESTS)


@settings(max_examples=400)
@given(st.binary(max_size=512))
def test_any_bytes_are_a_request_or_a_protocol_error(line):
    parsed_or_refused(line)
    parsed_or_refused(line + b"\n")


@settings(max_examples=400)
@given(st.text(max_size=200))
def test_any_text_is_a_request_or_a_protocol_error(line):
    parsed_or_refused(line)


@settings(max_examples=400)
@given(json_values)
def test_any_json_is_a_request_or_a_protocol_error(value):
    parsed_or_refused(json.dumps(value).encode())


@settings(max_examples=400)
@given(damaged_requests())
def test_a_damaged_request_is_a_request_or_a_protocol_error(wire):
    parsed_or_refused(json.dumps(wire).encode())


@settings(max_examples=300)
@given(valid_requests())
def test_what_is_encoded_is_read_back(wire):
    request = parse_request(encode(wire))
    assert request.op == wire["op"]
    if isinstance(request, Hello):
        assert (request.token, request.rank) == (wire["token"], wire["rank"])
    else:
        assert request.to_wire() == wire
        assert request.rank is None  # not on the wire: the server fills it in from the hello


@settings(max_examples=400)
@given(st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_are_an_answer_or_a_protocol_error(line):
    try:
        answer = parse_answer(line)
    except ProtocolError:
        return
    assert isinstance(answer, Answer)


@given(ids | st.none(), st.booleans(), nonneg, nonneg, st.text(max_size=50), st.sampled_from(["refused", "failed"]))
def test_an_answer_is_read_back(rid, ok, t0, t1, error, kind):
    answer = Answer(rid, ok, t0, t1, error=None if ok else error, kind=None if ok else kind)
    assert parse_answer(encode(answer.to_wire())) == answer


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b'{"op": "setup", "config": "ring", "id": 1, "t_job_ns": 5}' + b" " * MAX_LINE, "at most 65536"),
        (b'{"op": "explode", "id": 1}', "unknown op"),
        (b'{"op": "setup", "config": "ring", "id": 1}', "missing 't_job_ns'"),
        (b'{"op": "setup", "config": 7, "id": 1, "t_job_ns": 5}', "'config' must be a string"),
        (b'{"op": "setup", "config": "ring", "id": 1, "t_job_ns": true}', "'t_job_ns' must be a non-negative"),
        (b'{"op": "setup", "config": "ring", "id": 1, "t_job_ns": 1.5}', "'t_job_ns' must be a non-negative"),
        (b'{"op": "prepare", "config": "ring", "id": 1, "colour": "red"}', "unknown field 'colour'"),
        (b'{"op": "hello", "token": "t", "rank": -1}', "'rank' must be a non-negative"),
        (b'{"op": "hello", "op": "hello", "token": "t", "rank": 1}', "appears twice"),
        (b'{"op": "setup", "config": "ring", "id": 1, "t_job_ns": NaN}', "NaN"),
        (b"[1, 2]", "not an array"),
        (b"\xff\xfe", "not utf-8"),
        (b"[" * 100_000, "at most"),
        (b"[" * 60_000, "nested too deeply"),
        (b"", "empty"),
    ],
)
def test_each_wrong_line_is_named(line, says):
    with pytest.raises(ProtocolError, match=None) as caught:
        parse_request(line)
    assert says in str(caught.value)


def test_an_error_carries_the_request_s_id_when_it_can_be_read():
    with pytest.raises(ProtocolError) as caught:
        parse_request(b'{"op": "setup", "config": "", "id": "r3-7", "t_job_ns": 1}')
    assert caught.value.id == "r3-7"
