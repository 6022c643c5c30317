"""Hostile input both ways. The emulated front ends' TL1 parser: malformed commands, over-long input, a
missing `;`, bad CTAGs, bytes that are not ASCII: a DENY or a dropped command, never an exception, a hang or
a session that stops answering. The drivers' response parser: garbled, truncated and interleaved output,
autonomous messages, answers to other CTAGs: the right answer or a typed DeviceError, nothing else.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tl1_harness import CALIENT, POLATIS, Local, Raw, ScriptedTl1, block, settings_for

from drivers.errors import DeviceError, DeviceTimeout
from drivers.tl1 import make_calient_tl1, make_polatis_tl1
from drivers.tl1.calient import aid_of
from drivers.transports.tl1_messages import Tl1Reader, parse_block
from emulators.frontends import TWIN_PASSWORD

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the emulator's parser -------------------------------------------------------------------------------

VOCABULARY = [
    ":", "::", ";", ",", "&", "&&", '"', "\\", "/*", "*/", "\r\n", "\n", "\r", " ", "\t", "=",
    "ACT-USER", "CANC-USER", "admin", TWIN_PASSWORD, "ENT-PATCH", "DLT-PATCH", "RTRV-PATCH", "ALL",
    "RTRV-PORT-POWER", "OPR-PORT-SHUTTER", "RTRV-EQPT", "SYSTEM", "PARAMETER=SIZE", "RTRV-ALM-ALL",
    "ENT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS", "RTRV-CRS", "RTRV-PORT-SUM", "ED-PORT", "INAS=OOS",
    "1WAY", "2WAY", "1.1.1", "1.1.2", "9.9.9", "1", "3", "5", "8", "99", "0", "1234567", "-1",
    "INH-MSG-ALL", "RTRV-HDR", "\x00", "\xff", "é", "9" * 30,
]  # fmt: skip

garbage = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda t: t.encode("utf-8")),
    st.lists(st.sampled_from(VOCABULARY), max_size=40).map(lambda ws: "".join(ws).encode("utf-8")),
    st.integers(60_000, 70_000).map(lambda n: b"A" * n),  # past the input limit, no terminator
)


@QUICK
@given(st.sampled_from(["polatis", "calient"]), st.lists(garbage, min_size=1, max_size=6))
def test_the_front_end_survives_any_input_and_still_answers(dialect, chunks):
    switch = Local(dialect, 8)
    for chunk in chunks:
        switch.send(chunk)
    assert switch.frontend.internal_errors == []
    circuits = switch.engine.circuits()
    assert len(set(circuits.values())) == len(circuits)
    assert all(1 <= i <= 8 < e <= 16 for i, e in circuits.items())
    # Whatever came before, a line break and a good command get an answer for that command's CTAG.
    out = switch.send(f"\r\nACT-USER::admin:zz8::{TWIN_PASSWORD};RTRV-HDR:::zz9:;")
    assert any("\r\nM  zz9 COMPLD\r\n" in b for b in out), out
    # Everything it sent is TL1 that the driver's reader takes apart block by block.
    text = "".join(switch.out).replace("agent>", "")
    messages = Tl1Reader().feed(text)
    assert len(messages) == len([b for b in switch.out if b.strip(" \r\nagent>")])


@pytest.mark.parametrize("device", [POLATIS, CALIENT])
def test_over_tcp_a_flood_without_terminator_is_dropped_and_the_session_goes_on(tl1_twin, device):
    c = Raw(tl1_twin.endpoints.devices[device]["tl1"])
    try:
        c.send(f"ACT-USER::admin:1::{TWIN_PASSWORD};")
        c.response("1")
        c.send(b"RTRV-HDR:::2:" + b"x" * 200_000 + b";\r\n" + bytes(range(256)) + b"\r\nRTRV-HDR:::3:;")
        after = c.response("3")
        assert b"COMPLD" in after
        assert b"M  2 " not in c.buf  # the over-long command was dropped, not answered
    finally:
        c.close()


@settings(max_examples=15, deadline=None)
@given(st.lists(garbage.filter(lambda g: len(g) < 1000), min_size=1, max_size=4))
def test_over_tcp_garbage_never_stops_the_server(tl1_twin, chunks):
    c = Raw(tl1_twin.endpoints.devices[POLATIS]["tl1"])
    try:
        for chunk in chunks:
            c.send(chunk)
        c.send("\r\nRTRV-HDR:::zz9:;")
        assert c.response("zz9", timeout=2.0)
    finally:
        c.close()


# -- the driver's response parser -------------------------------------------------------------------------

EXPECTED = {1: 17, 2: 18}
PATCH_LINES = ['"1,17"', '"2,18"']
CRS_LINES = [
    f'"{aid_of(s)}>{aid_of(d)}:SRCPORT={aid_of(s)},DSTPORT={aid_of(d)},GRPNAME=g,CONNNAME={aid_of(s)}>{aid_of(d)},'
    'CONNTYPE=1WAY,AS=UMA,OS=RDY,OC=OK,PS=UPR,AL=CL"'
    for s, d in ((1, 1), (2, 2))
]
ALARM = (
    b'\r\n\n   fake 24-05-01 12:00:00\r\n** 7 REPT ALM\r\n   "3:MJ,FAIL,SA,05-01,12-00-00,,RCV:\\"port failed\\""\r\n;'
)
well_formed_noise = st.lists(
    st.one_of(
        st.just(ALARM),
        st.sampled_from(["99", "0", "1"]).map(lambda t: block(t, "COMPLD", ['"5,21"'])),  # answers to other CTAGs
        st.sampled_from(["98", "1"]).map(lambda t: block(t, "DENY", ["IIAC"])),
        st.just(b"IP 97\r\n<"),
        st.just(b"\r\nagent>"),
        st.just(b"\r\n<"),
    ),
    max_size=4,
).map(b"".join)
noise = st.one_of(well_formed_noise, st.binary(max_size=80), st.text(max_size=40).map(str.encode))


@st.composite
def answers(draw, lines: list[str]):
    """(bytes the peer sends for the query, whether they hold the intact answer after well-formed noise)."""
    before = draw(noise)
    clean = draw(st.booleans())
    good = block("{ctag}", "COMPLD", lines)
    if clean:
        return before + good + draw(well_formed_noise), True
    how = draw(st.sampled_from(["truncate", "insert", "status", "ctag", "lines", "continued"]))
    at = draw(st.integers(0, len(good)))
    if how == "truncate":
        reply = good[:at]
    elif how == "insert":  # not a `;`: one in the body ends the response early, and TL1 cannot tell
        reply = good[:at] + draw(st.binary(min_size=1, max_size=20).filter(lambda b: b";" not in b)) + good[at:]
    elif how == "status":
        reply = good.replace(b"COMPLD", draw(st.sampled_from([b"DENY", b"PRTL", b"RTRV", b"COMPLETE", b""])))
    elif how == "ctag":
        reply = good.replace(b"{ctag}", b"{ctag}0")
    elif how == "lines":  # well framed, but lines no switch sends
        wrong = st.text(st.characters(codec="ascii", exclude_characters="\r\n;"), max_size=30).map("?{}".format)
        reply = block("{ctag}", "COMPLD", draw(st.lists(wrong, min_size=1, max_size=3)))
    else:  # the first part ended by `>`, the rest never sent
        reply = good[:-1] + b">"
    return before + reply, False


@pytest.fixture(scope="module")
def peer():
    server = ScriptedTl1(lambda verb, ctag: None)
    yield server
    server.stop()


def _script(reply: bytes, lines_verb: str):
    ports = b"".join(f'   "{aid_of(k)}:WX,NONE,NONE:INAS=IS"\r\n'.encode() for k in range(1, 17))

    def script(verb: str, ctag: str) -> bytes | None:
        if verb == "RTRV-PORT":  # the Calient driver's port list, before it reads cross-connects
            return f"\r\n\n   fake 24-05-01 12:00:00\r\nM  {ctag} COMPLD\r\n".encode() + ports + b";"
        if verb == lines_verb:
            return reply.replace(b"{ctag}", ctag.encode())
        return block(ctag)

    return script


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["polatis", "calient"]), st.data())
def test_the_driver_returns_the_answer_or_a_device_error(peer, dialect, data):
    lines, verb, make = (
        (PATCH_LINES, "RTRV-PATCH", make_polatis_tl1)
        if dialect == "polatis"
        else (CRS_LINES, "RTRV-CRS", make_calient_tl1)
    )
    reply, intact = data.draw(answers(lines))
    peer.script = _script(reply, verb)
    driver = make("fake", settings_for(peer.endpoint, timeout_s=0.05))
    try:
        got = driver.connections()
    except DeviceError as err:
        assert not intact, f"{type(err).__name__} for an intact answer: {err}"
        assert err.device == "fake" and err.address == "admin@" + peer.endpoint
        return
    finally:
        driver.close()
    assert got == EXPECTED


def test_a_reply_for_another_ctag_is_not_taken_for_ours(peer):
    peer.script = lambda verb, ctag: block(str(int(ctag) + 1), "COMPLD", PATCH_LINES)
    driver = make_polatis_tl1("fake", settings_for(peer.endpoint, timeout_s=0.1))
    try:
        with pytest.raises(DeviceTimeout) as info:
            driver.connections()
        assert "no response with CTAG 2" in str(info.value) and "M  3 COMPLD" in info.value.received
    finally:
        driver.close()


@st.composite
def streams(draw):
    pieces = draw(st.lists(st.one_of(well_formed_noise, st.binary(max_size=40)), max_size=6))
    data = b"".join(pieces).decode("utf-8", errors="backslashreplace")
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    return data, cuts


@QUICK
@given(streams())
def test_the_reader_does_not_care_how_output_is_cut(stream):
    data, cuts = stream
    whole = Tl1Reader().feed(data)
    reader, parts, last = Tl1Reader(), [], 0
    for cut in [*cuts, len(data)]:
        parts += reader.feed(data[last:cut])
        last = cut
    assert parts == whole
    assert all(parse_block(m.text, m.more) == m for m in whole)
