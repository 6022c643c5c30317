"""The Polatis OCS engine (emulators/scpi/ocs.py) in virtual time: grammar, state model, timing, faults."""

from __future__ import annotations

import json

import pytest

from emulators.scpi.ocs import DARK_DBM, PolatisEngine
from emulators.spec import OcsSpec

IDN = "Polatis,N-OST-32x32-LU1-DMHNS,000001,6.5.2.18"
MOVE = 0.025  # switching_time_ms = 25, jitter 0


def make(**kw) -> PolatisEngine:
    spec = OcsSpec("ocs1", size=32, jitter_ms=0.0, input_power_dbm={1: -3.0, 2: -4.5, 3: 0.0}, **kw)
    return PolatisEngine(spec, clock=lambda: 0.0)


def ask(ocs: PolatisEngine, line: str, now: float = 0.0) -> list[str]:
    # Each call uses a fresh session so that virtual time may go backwards between test steps
    # without the per-session reply ordering pushing answers later.
    return [r.data.decode().removesuffix("\r\n") for r in ocs.new_session().handle(line, now)]


def one(ocs: PolatisEngine, line: str, now: float = 0.0) -> str:
    answers = ask(ocs, line, now)
    assert len(answers) == 1, answers
    return answers[0]


def error_codes(ocs: PolatisEngine) -> list[int]:
    codes = []
    while (text := one(ocs, ":SYST:ERR?")) != '0,"No error"':
        codes.append(int(text.split(",")[0]))
    return codes


def power(ocs: PolatisEngine, ports: str, now: float) -> list[float]:
    return [float(v) for v in one(ocs, f":PMON:POW? (@{ports})", now).split(",")]


def test_identity_and_size():
    ocs = make()
    assert one(ocs, "*IDN?") == IDN
    assert one(ocs, ":OXC:SWITch:SIZE?") == "32,32"
    assert one(ocs, "oxc:swit:size?") == "32,32"


@pytest.mark.parametrize(
    "add",
    [
        ":OXC:SWITch:CONNect:ADD (@1,2),(@33,34)",
        ":oxc:swit:conn:add (@1,2),(@33,34)",
        "oxc:swit:conn:add (@1, 2),(@33, 34)",
        "OXC:SWITCH:CONNECT:ADD (@1,2),(@33,34),NORM",  # optional mode
        ":oxc:swit:conn:add (@1:2),(@33:34);",
    ],
)
def test_add_in_every_spelling(add):
    ocs = make()
    assert ask(ocs, add) == []  # a set command answers nothing
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1,2),(@33,34)"
    assert error_codes(ocs) == []


def test_compound_with_path_memory():
    ocs = make()
    assert ask(ocs, ":oxc:swit:conn:only (@1,2),(@33,34); stat?") == ["(@1,2),(@33,34)"]
    assert ask(ocs, ":oxc:swit:conn:only (@5),(@40);stat?;:OXC:SWIT:SIZE?") == ["(@5),(@40)", "32,32"]


def test_cls_port_query_opc_compound():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@5),(@37)", 0.0)
    replies = ocs.new_session().handle("*CLS;:OXC:SWITch:CONNect:PORT? 5;*OPC?", 0.001)
    assert [r.data for r in replies] == [b"37\r\n", b"1\r\n"]
    assert [r.at for r in replies] == [0.001, pytest.approx(MOVE)]  # PORT? at once, *OPC? when settled


def test_port_query_forms():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@5),(@37)")
    assert one(ocs, ":OXC:SWIT:CONN:PORT? 37") == "5"
    assert one(ocs, ":OXC:SWIT:CONN:PORT? (@5)") == "37"
    assert one(ocs, ":OXC:SWIT:CONN:PORT? 6") == ""  # unconnected: an empty line
    quoted = PolatisEngine(OcsSpec("q", size=32), quote_port_reply=True)
    ask(quoted, ":OXC:SWIT:CONN:ADD (@5),(@37)")
    assert one(quoted, ":OXC:SWIT:CONN:PORT? 5") == '"37"'
    assert one(quoted, ":OXC:SWIT:CONN:PORT? 6") == '""'
    assert ask(ocs, ":OXC:SWIT:CONN:PORT? 65") == []  # a failed query answers nothing
    assert error_codes(ocs) == [-222]


def test_empty_state_and_channel_list_forms():
    ocs = make()
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@),(@)"
    ask(ocs, ":OXC:SWIT:CONN:ADD (@3,1),(@40,33)")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1,3),(@33,40)"  # sorted by ingress
    ask(ocs, ":OXC:SWIT:CONN:SUB (@1,3),(@)")  # empty egress list: remove by ingress
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@),(@)"
    ask(ocs, ":OXC:SWIT:CONN:ADD (@),(@)")
    assert error_codes(ocs) == []


def test_sub_removes_only_matching_pairs():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@33,34)")
    ask(ocs, ":OXC:SWIT:CONN:SUB (@1,2),(@33,35)")  # 2 is on 34, not 35: kept
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@2),(@34)"


def test_add_repoints_an_connected_ingress():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33)")
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@40)")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1),(@40)"
    assert error_codes(ocs) == []


def test_egress_in_use_is_a_settings_conflict_without_effect():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33)")
    ask(ocs, ":OXC:SWIT:CONN:ADD (@4,2),(@36,33)")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1),(@33)"
    assert error_codes(ocs) == [-221]
    # swapping two circuits in one command is not a conflict: the end state is 1:1
    ask(ocs, ":OXC:SWIT:CONN:ADD (@2),(@34)")
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@34,33)")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1,2),(@34,33)"
    assert error_codes(ocs) == []


@pytest.mark.parametrize(
    "command, code",
    [
        (":OXC:SWIT:CONN:ADD (@1,99),(@33,34)", -222),  # ingress out of range
        (":OXC:SWIT:CONN:ADD (@1),(@65)", -222),  # egress out of range
        (":OXC:SWIT:CONN:ADD (@33),(@1)", -222),  # ingress/egress swapped
        (":OXC:SWIT:CONN:ADD (@0),(@33)", -222),
        (":OXC:SWIT:CONN:ADD (@1,2),(@33)", -109),  # fewer egress than ingress
        (":OXC:SWIT:CONN:ADD (@1),(@33,34)", -224),  # more egress than ingress
        (":OXC:SWIT:CONN:ADD (@1,1),(@33,34)", -224),  # a port twice
        (":OXC:SWIT:CONN:ADD (@1)", -109),
        (":OXC:SWIT:CONN:ADD 1,33", -102),
        (":OXC:SWIT:CONN:ONLY (@1),(@99)", -222),
        (":OXC:SWIT:PORT:DIS (@1,65)", -222),
        (":OXC:SWIT:DISC:ALL 3", -108),
        (":OXC:BOOT:MODE LATER", -224),
    ],
)
def test_bad_commands_queue_an_error_and_have_no_effect(command, code):
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@5),(@37)")
    before = ocs.state(now=1.0)
    assert ask(ocs, command, now=1.0) == []
    assert error_codes(ocs) == [code]
    assert ocs.state(now=1.0) == before


def test_only_replaces_everything_and_keeps_unchanged_circuits_lit():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@33,34)", 0.0)
    ask(ocs, ":OXC:SWIT:CONN:ONLY (@1,3),(@33,35)", 1.0)
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@1,3),(@33,35)"
    assert ocs.state(now=1.001)["moving"] == [2, 3, 34, 35]
    assert power(ocs, "33,34,35", 1.001) == [-4.0, DARK_DBM, DARK_DBM]
    assert power(ocs, "33,34,35", 1.0 + MOVE) == [-4.0, DARK_DBM, -1.0]


def test_disconnect_all_and_rst():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@33,34);:OXC:SWIT:PORT:DIS (@3)")
    ask(ocs, ":OXC:SWITch:DISConnect:ALL")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@),(@)"
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@33,34)")
    ask(ocs, "*RST")
    assert one(ocs, ":OXC:SWIT:CONN:STAT?") == "(@),(@)"
    assert one(ocs, ":OXC:SWIT:PORT:STAT? (@3)") == "(E)"


def test_opc_query_answers_at_settle_time():
    ocs = make()
    replies = ocs.handle(":OXC:SWIT:CONN:ADD (@1),(@33);*OPC?", 10.0)
    assert [r.data for r in replies] == [b"1\r\n"]
    assert replies[0].at == pytest.approx(10.0 + MOVE)
    assert ocs.state(now=10.0)["settled_at"] == pytest.approx(10.0 + MOVE)
    # nothing moving: *OPC? answers at once
    assert ocs.new_session().handle("*OPC?", 11.0)[0].at == 11.0


def test_opc_and_wai_follow_the_move():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33);*OPC", 0.0)
    assert one(ocs, "*ESR?", 0.010) == "0"
    assert one(ocs, "*ESR?", MOVE) == "1"
    replies = ocs.new_session().handle(":OXC:SWIT:CONN:ADD (@2),(@34);*WAI;:PMON:POW? (@34)", 1.0)
    assert replies[0].at == pytest.approx(1.0 + MOVE)
    assert replies[0].data == b"-5.50\r\n"  # measured after the wait: lit


def test_jitter_is_seeded_and_bounded():
    def settle_times(seed: int) -> list[float]:
        ocs = PolatisEngine(OcsSpec("j", size=8, switching_time_ms=25, jitter_ms=5, seed=seed))
        out = []
        for k in range(20):
            out.append(ocs.handle(f":OXC:SWIT:CONN:ONLY (@{k % 8 + 1}),(@9);*OPC?", 100.0 * k)[0].at - 100.0 * k)
        return out

    a, b, c = settle_times(1), settle_times(1), settle_times(2)
    assert a == b and a != c
    assert all(0.020 <= t <= 0.030 for t in a)
    assert max(a) - min(a) > 0.001  # the jitter is really applied


def test_dark_while_moving_then_lit():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33)", 0.0)
    assert power(ocs, "1,33", 0.001) == [-3.0, DARK_DBM]  # ingress light is there, egress dark
    assert power(ocs, "1,33", MOVE - 1e-6) == [-3.0, DARK_DBM]
    assert power(ocs, "1,33", MOVE) == [-3.0, -4.0]  # input - 1 dB insertion loss
    assert one(ocs, ":PMON:POW? (@1,33)", MOVE) == "-3.00,-4.00"
    # re-pointing moves the circuit again: dark until settled
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@40)", 1.0)
    assert power(ocs, "33,40", 1.0 + MOVE / 2) == [DARK_DBM, DARK_DBM]
    assert power(ocs, "33,40", 1.0 + MOVE) == [DARK_DBM, -4.0]


def test_unconnected_or_unlit_ports_are_dark():
    ocs = make()
    assert power(ocs, "4,33", 0.0) == [DARK_DBM, DARK_DBM]  # no input light on 4, 33 unconnected
    ask(ocs, ":OXC:SWIT:CONN:ADD (@4),(@36)", 0.0)
    assert power(ocs, "36", 1.0) == [DARK_DBM]


def test_disabled_ports_are_dark():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1,2),(@33,34)", 0.0)
    ask(ocs, ":OXC:SWIT:PORT:DISable (@1,34)", 1.0)
    assert one(ocs, ":OXC:SWIT:PORT:STATe? (@1,2,33,34)") == "(D,E,E,D)"
    assert power(ocs, "1,2,33,34", 1.0) == [DARK_DBM, -4.5, DARK_DBM, DARK_DBM]
    ask(ocs, ":OXC:SWIT:PORT:ENAB (@1,34)", 2.0)
    assert power(ocs, "1,2,33,34", 2.0) == [-3.0, -4.5, -4.0, -5.5]


def test_failed_ports_are_dark_until_restored():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33)", 0.0)
    ocs.fail_port(33)
    assert one(ocs, ":OXC:SWIT:PORT:STAT? (@1,33)") == "(E,F)"
    assert power(ocs, "33", 1.0) == [DARK_DBM]
    ask(ocs, ":OXC:SWIT:PORT:ENAB (@33)")  # enabling does not repair a failed port
    assert one(ocs, ":OXC:SWIT:PORT:STAT? (@33)") == "(F)"
    ocs.restore_port(33)
    assert power(ocs, "33", 1.0) == [-4.0]
    ocs.fail_port(1)  # a failed ingress darkens its circuit too
    assert power(ocs, "1,33", 1.0) == [DARK_DBM, DARK_DBM]
    with pytest.raises(ValueError):
        ocs.fail_port(65)


def test_control_api_power_and_timing():
    ocs = make()
    ask(ocs, ":OXC:SWIT:CONN:ADD (@5),(@40)", 0.0)
    assert power(ocs, "40", 1.0) == [DARK_DBM]
    ocs.set_input_power(5, -7.25)
    assert power(ocs, "5,40", 1.0) == [-7.25, -8.25]
    ocs.set_input_power(5, None)
    assert power(ocs, "5", 1.0) == [DARK_DBM]
    with pytest.raises(ValueError):
        ocs.set_input_power(40, 0.0)  # light enters on ingress ports
    ocs.set_switching_time(100, jitter_ms=0)
    assert ocs.handle(":OXC:SWIT:CONN:ADD (@6),(@41);*OPC?", 2.0)[0].at == pytest.approx(2.1)


def test_boot_mode():
    ocs = make()
    assert one(ocs, ":OXC:BOOT:MODE?") == "DARK"
    ask(ocs, ":OXC:BOOT:MODE RESTore")
    assert one(ocs, ":OXC:BOOT:MODE?") == "REST"
    ask(ocs, ":oxc:boot:mode autosave")
    assert one(ocs, ":OXC:BOOT:MODE?") == "AUT"


def test_state_is_json_and_reset_restores_the_spec():
    ocs = make()
    fresh = json.dumps(ocs.state(now=0.0))
    ask(ocs, ":OXC:SWIT:CONN:ADD (@1),(@33);:OXC:SWIT:PORT:DIS (@2);BOGUS", 0.0)
    ocs.fail_port(3)
    ocs.set_input_power(1, 5.0)
    ocs.set_switching_time(1.0, 0.0)
    state = ocs.state(now=0.001)
    assert state["connections"] == [[1, 33]]
    assert state["port_states"]["2"] == "D" and state["port_states"]["3"] == "F"
    assert state["moving"] == [1, 33]
    assert state["errors"] == ['-113,"Undefined header;BOGUS"']
    json.dumps(state)
    ocs.reset()
    assert json.dumps(ocs.state(now=0.0)) == fresh


def test_reset_reseeds_the_rng():
    ocs = PolatisEngine(OcsSpec("r", size=4, jitter_ms=3.0, seed=7))
    first = [ocs.handle(f":OXC:SWIT:CONN:ONLY (@{i}),(@5);*OPC?", 10.0 * i)[0].at for i in (1, 2, 3)]
    ocs.reset()
    again = [ocs.handle(f":OXC:SWIT:CONN:ONLY (@{i}),(@5);*OPC?", 10.0 * i)[0].at for i in (1, 2, 3)]
    assert first == again


def test_rejects_impossible_spec():
    with pytest.raises(ValueError, match="size"):
        PolatisEngine(OcsSpec("bad", size=0))
