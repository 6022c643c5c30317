"""What a parsed TL1 response means for the caller: the answer, a Tl1Denied naming the error code, its meaning
and what to try, or a protocol error; and several refusals reported as one.
"""

from __future__ import annotations

import pickle

import pytest

from drivers.errors import DeviceCommandError, DeviceProtocolError
from drivers.transports.tl1_messages import Tl1Message, parse_block
from drivers.transports.tl1_refusals import FORM_HINT, HINTS, Tl1Denied, accepted, combined_refusals

SENT = "ENT-PATCH::1,17:12;"
WHERE = {"sent": SENT, "device": "sw1", "address": "admin@host:3082", "hints": HINTS}


def response(code: str, *body: str) -> Tl1Message:
    text = "\r\n\n   sw1 24-05-01 12:00:00\r\nM  12 " + code + "\r\n" + "".join(f"   {b}\r\n" for b in body) + ";"
    message = parse_block(text)
    assert message is not None
    return message


def refusal(code: str, *body: str) -> Tl1Denied:
    with pytest.raises(Tl1Denied) as info:
        accepted(response(code, *body), **WHERE)
    return info.value


@pytest.mark.parametrize("code", ["COMPLD", "DELAY"])
def test_a_carried_out_command_gives_its_response(code):
    answer = response(code, '"1,17"')
    assert accepted(answer, **WHERE) is answer


def test_a_denial_names_the_error_code_its_meaning_the_comment_and_what_to_try():
    err = refusal("DENY", "IIAC", "/* port 99 is not equipped */")
    assert err.code == "IIAC" and err.response is not None and err.response.code == "DENY"
    meaning = "invalid access identifier (port)"
    assert err.message == f"the switch denied ENT-PATCH: IIAC ({meaning}): port 99 is not equipped"
    assert err.hint == HINTS["IIAC"]
    assert (err.device, err.address, err.sent) == ("sw1", "admin@host:3082", SENT)
    assert err.received.startswith("sw1 24-05-01") and err.received.endswith(";")


def test_the_error_code_is_the_first_four_letter_word():
    assert refusal("DENY", "ERR=12", "SNVS").code == "SNVS"


def test_a_partial_completion_is_a_refusal_too():
    err = refusal("PRTL", "SROF")
    assert err.message == "the switch partly carried out (PRTL) ENT-PATCH: SROF (requested operation failed)"


def test_an_unknown_error_code_points_at_the_command_form():
    err = refusal("DENY", "ZZZZ")
    assert "ZZZZ (unknown error code)" in err.message and err.hint == FORM_HINT


def test_a_denial_without_an_error_code_says_so():
    err = refusal("DENY")
    assert err.code == "" and "ENT-PATCH: ? (unknown error code)" in err.message


def test_a_driver_s_own_hint_is_used_for_its_code():
    with pytest.raises(Tl1Denied) as info:
        accepted(response("DENY", "SNVS"), **{**WHERE, "hints": {**HINTS, "SNVS": "disconnect port 1 first"}})
    assert info.value.hint == "disconnect port 1 first"


def test_another_completion_code_is_a_protocol_error():
    with pytest.raises(DeviceProtocolError, match="unexpected completion code RTRV for ENT-PATCH"):
        accepted(response("RTRV"), **WHERE)


def test_a_denial_survives_pickling_without_its_response():
    err = pickle.loads(pickle.dumps(refusal("DENY", "IIAC")))
    assert isinstance(err, Tl1Denied) and err.code == "IIAC" and err.response is None
    assert str(err) == str(refusal("DENY", "IIAC"))


def test_one_refusal_is_reported_as_it_is():
    err = refusal("DENY", "IIAC")
    assert combined_refusals([err], "connect", "sw1", "admin@host:3082") is err


def test_several_refusals_are_reported_as_one_error_led_by_the_first():
    first, second = refusal("DENY", "IIAC"), refusal("DENY", "SNVS")
    err = combined_refusals([first, second], "connect", "sw1", "admin@host:3082")
    assert type(err) is DeviceCommandError
    assert err.message == f"the switch refused 2 command(s) of connect; the first: {first.message}"
    assert err.sent == f"{SENT}\n{SENT}" and err.hint == first.hint
    assert err.received == f"{first.received}\n{second.received}"
