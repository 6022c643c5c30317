"""The TL1 parser on its own, no socket: each kind of block a switch sends read as the message it is, and any
text at all read as messages or refused with a clear ValueError, never another exception.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drivers.transports.tl1_messages import COMPLETION, MAX_BUFFER, Tl1Message, Tl1Reader, joined, parse_block

HEADER = "\r\n\n   fake 24-05-01 12:00:00\r\n"
RESPONSE = HEADER + 'M  12 COMPLD\r\n   "1,17"\r\n   "2,18"\r\n;'
REFUSAL = HEADER + "M  13 DENY\r\n   IIAC\r\n   /* port 99 is not equipped */\r\n;"
ACK = "IP 14\r\n<"
ALARM = HEADER + '** 7 REPT ALM\r\n   "3:MJ,FAIL,SA,05-01,12-00-00,,RCV:\\"port failed\\""\r\n;'
FIRST_PART = HEADER + 'M  15 COMPLD\r\n   "1,17"\r\n>'
LAST_PART = HEADER + 'M  15 COMPLD\r\n   "2,18"\r\n;'


def read(*chunks: str) -> tuple[list[Tl1Message], str]:
    reader = Tl1Reader()
    found = [m for chunk in chunks for m in reader.feed(chunk)]
    return found, reader.pending


# -- each kind of block -------------------------------------------------------------------------------------


def test_a_response_gives_its_ctag_completion_code_sid_and_unquoted_lines():
    [m], pending = read(RESPONSE)
    assert (m.kind, m.tag, m.code, m.sid) == ("response", "12", "COMPLD", "fake")
    assert m.lines == ("1,17", "2,18") and m.content == ("1,17", "2,18")
    assert m.text == RESPONSE and not m.more and pending == ""


def test_a_refusal_gives_its_error_code_as_a_word_and_its_comment_apart():
    [m], _ = read(REFUSAL)
    assert (m.kind, m.tag, m.code) == ("response", "13", "DENY")
    assert m.words == ("IIAC",) and m.comments == ("port 99 is not equipped",) and m.lines == ()


def test_an_in_progress_acknowledgment_ends_at_its_lt_sign():
    [m], pending = read(ACK)
    assert (m.kind, m.tag, m.code) == ("ack", "14", "IP")
    assert pending == ""


def test_an_lt_sign_that_follows_no_acknowledgment_is_a_prompt_not_a_block_end():
    found, pending = read("\r\nagent>\r\n<")
    assert found == [] and pending == "\r\nagent>\r\n<"
    found, pending = read("\r\n<" + RESPONSE)
    assert [m.tag for m in found] == ["12"] and pending == ""


def test_an_autonomous_message_gives_its_alarm_code_atag_verb_and_unescaped_lines():
    [m], _ = read(ALARM)
    assert (m.kind, m.tag, m.code, m.verb, m.sid) == ("autonomous", "7", "**", "REPT ALM", "fake")
    assert m.lines == ('3:MJ,FAIL,SA,05-01,12-00-00,,RCV:"port failed"',)


def test_a_continued_response_comes_in_parts_that_join_into_one():
    found, _ = read(FIRST_PART, ALARM, LAST_PART)
    first, alarm, last = found
    assert first.more and not last.more and alarm.kind == "autonomous"
    whole = joined([first, last])
    assert (whole.kind, whole.tag, whole.code, whole.sid) == ("response", "15", "COMPLD", "fake")
    assert whole.lines == ("1,17", "2,18") and not whole.more
    assert whole.text == FIRST_PART + LAST_PART


def test_a_response_in_one_block_joins_to_itself():
    [m], _ = read(RESPONSE)
    assert joined([m]) is m


def test_a_semicolon_in_a_quoted_line_or_a_comment_does_not_end_the_block():
    text = HEADER + 'M  16 COMPLD\r\n   "a;b"\r\n   /* c; d */\r\n;'
    [m], _ = read(text)
    assert m.lines == ("a;b",) and m.comments == ("c; d",) and m.text == text


def test_a_comment_opener_cut_in_two_by_the_network_is_still_a_comment():
    head, tail = "M  17 DENY\r\n   SNVS\r\n   /* in use; busy */\r\n;".split("/", 1)
    [m], _ = read(head + "/", tail)
    assert m.comments == ("in use; busy",)


def test_a_stray_quote_is_closed_by_the_end_of_its_line():
    [m], _ = read('garbage "\r\n' + RESPONSE)
    assert m.tag == "12"


def test_output_that_is_no_message_is_dropped():
    found, pending = read("RTRV-HDR:::1;" + RESPONSE + "\r\n   fake")
    assert [m.tag for m in found] == ["12"] and pending == "\r\n   fake"
    assert parse_block("RTRV-HDR:::1;") is None


def test_a_megabyte_without_a_block_end_is_not_tl1():
    reader = Tl1Reader()
    assert reader.feed("x" * MAX_BUFFER) == []
    with pytest.raises(ValueError, match=f"{MAX_BUFFER + 1} characters without the end of a TL1 block"):
        reader.feed("x")


# -- any text ---------------------------------------------------------------------------------------------

VOCABULARY = [
    ";", ">", "<", '"', "\\", '\\"', "/*", "*/", "/", "*", "\r\n", "\n", "\r", " ", "   ",
    "M  5 COMPLD", "M  5 DENY", "M 6 PRTL", "M  7 RTRV", "IP 5", "PF 8", "** 9 REPT ALM", "*C 1 REPT EVT",
    "A  2 REPT DBCHG", "fake 24-05-01 12:00:00", "IIAC", '"1,17"', "agent>", "é", "\x00",
]  # fmt: skip
tl1ish = st.lists(st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=12)), max_size=60).map("".join)
any_text = st.one_of(tl1ish, st.text(max_size=300))
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(any_text, st.booleans())
def test_any_block_is_a_well_formed_message_or_none(text, more):
    m = parse_block(text, more)
    if m is None:
        return
    assert m.text == text
    if m.kind == "response":
        assert m.tag and m.code in COMPLETION and m.more == more
    elif m.kind == "autonomous":
        assert m.tag and m.code in ("*C", "**", "*", "A") and m.verb and not m.more
    else:
        assert m.kind == "ack" and m.tag and text.rstrip().endswith("<")


@FUZZ
@given(st.lists(any_text, max_size=6))
def test_any_stream_is_cut_into_pieces_of_itself_in_order(chunks):
    reader, found = Tl1Reader(), []
    for chunk in chunks:
        found += reader.feed(chunk)
    stream, at = "".join(chunks), 0
    for m in found:  # every message is a block of the stream, the blocks in order, none overlapping
        at = stream.index(m.text, at) + len(m.text)
        assert parse_block(m.text, m.more) == m
    assert stream.endswith(reader.pending) and len(reader.pending) <= len(stream) - at


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_text)
def test_any_text_then_a_flood_without_a_block_end_is_refused_with_a_value_error(text):
    reader = Tl1Reader()
    reader.feed(text)
    with pytest.raises(ValueError, match="characters without the end of a TL1 block"):
        reader.feed("x" * (MAX_BUFFER + 1))
