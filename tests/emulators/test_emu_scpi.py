"""The generic SCPI engine (emulators/scpi/engine.py), in virtual time, on a toy multi-channel source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulators.scpi.engine import (
    Call,
    ScpiEngine,
    ScpiError,
    parse_channel_list,
    parse_float,
    parse_int,
    split_top_level,
)
from emulators.scpi.engine import _split_top_level_chars as split_by_characters


class ToySource(ScpiEngine):
    """A 4-channel current source whose outputs take 10 ms to settle after a change."""

    def __init__(self, **options):
        super().__init__("ACME,SRC4,1,0.1", **options)
        self.current = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
        self.busy_until = 0.0
        self.label = ""
        self.register(":SOURce#:CURRent[:LEVel]", self._set_current, args=(1, 1))
        self.register(":SOURce#:CURRent[:LEVel]?", lambda c: f"{self.current[self._ch(c)]:.3f}")
        self.register(":SYSTem:LABel", self._set_label, args=(1, 1))
        self.register(":SYSTem:LABel?", lambda c: f'"{self.label}"')

    def _ch(self, call: Call) -> int:
        if call.suffixes[0] not in self.current:
            raise ScpiError(-222, "no such channel")
        return call.suffixes[0]

    def _set_current(self, call: Call) -> None:
        self.current[self._ch(call)] = parse_float(call.args[0])
        self.busy_until = call.now + 0.010

    def _set_label(self, call: Call) -> None:
        self.label = call.args[0].strip("\"'")

    def operations_complete_at(self, now: float) -> float:
        return max(now, self.busy_until)

    def reset_device(self, now: float) -> None:
        self.current = dict.fromkeys(self.current, 0.0)


def ask(engine: ScpiEngine, line: str, now: float = 0.0) -> list[str]:
    return [r.data.decode() for r in engine.handle(line, now)]


def errors(engine: ScpiEngine, now: float = 0.0) -> list[int]:
    out = []
    while (text := ask(engine, ":SYST:ERR?", now)[0]) != '0,"No error"\r\n':
        out.append(int(text.split(",")[0]))
    return out


def test_short_long_and_case_forms_are_equivalent():
    src = ToySource()
    for header in [":SOUR2:CURR", "SOURCE2:CURRENT", ":sour2:curr:lev", ":Source2:Current:Level"]:
        ask(src, f"{header} 1.5")
        assert src.current[2] == 1.5
        src.current[2] = 0.0
    assert errors(src) == []


def test_partial_mnemonics_are_undefined_headers():
    src = ToySource()
    assert ask(src, ":SOURC2:CURR 1") == []  # between the short and the long form
    assert ask(src, ":SOU2:CURR 1") == []
    assert errors(src) == [-113, -113]


def test_numeric_suffix_defaults_to_one():
    src = ToySource()
    ask(src, "SOUR:CURR 0.25")
    assert ask(src, "SOUR1:CURR?") == ["0.250\r\n"]
    assert ask(src, "SOUR9:CURR?") == []
    assert errors(src) == [-222]


def test_path_memory_and_root_reset():
    src = ToySource()
    # after SOUR3:CURR the path is SOUR3:, so a bare CURR? means SOUR3:CURR?
    assert ask(src, ":SOUR3:CURR 2; CURR?; :SYST:LAB 'x'; LAB?") == ["2.000\r\n", '"x"\r\n']
    # a common command does not change the path
    assert ask(src, ":SOUR3:CURR 3;*CLS;CURR?") == ["3.000\r\n"]
    # path memory lasts one message only
    assert ask(src, "CURR?") == []
    assert errors(src) == [-113]


def test_quoted_strings_and_parentheses_protect_separators():
    assert split_top_level("A 'x;y';B (@1;2),\"q;\"", ";") == ["A 'x;y'", 'B (@1;2),"q;"']
    src = ToySource()
    ask(src, ':SYST:LAB "a;b"')
    assert src.label == "a;b"


def test_parameter_count_errors():
    src = ToySource()
    ask(src, ":SOUR1:CURR")
    ask(src, ":SOUR1:CURR 1,2")
    ask(src, "*IDN? 3")
    ask(src, ":SOUR1:CURR 1,")
    assert errors(src) == [-109, -108, -108, -102]


def test_channel_lists():
    assert parse_channel_list("(@1,2,3)") == [1, 2, 3]
    assert parse_channel_list("(@1, 2, 3)") == [1, 2, 3]
    assert parse_channel_list("( @ )") == []
    assert parse_channel_list("(@)") == []
    assert parse_channel_list("(@1:4)") == [1, 2, 3, 4]
    assert parse_channel_list("(@4:2,7)") == [4, 3, 2, 7]
    for bad in ["1,2", "(@1,,2)", "(@a)", "(@1:)", "(1)"]:
        with pytest.raises(ScpiError) as err:
            parse_channel_list(bad)
        assert err.value.code == -102
    with pytest.raises(ScpiError) as err:
        parse_channel_list("(@1:4)", allow_ranges=False)
    assert err.value.code == -102
    with pytest.raises(ScpiError) as err:
        parse_channel_list("(@1:999999999)")
    assert err.value.code == -224


@given(st.text(alphabet="ab ;,()'\"@1:", max_size=40), st.sampled_from([";", ","]))
def test_fast_split_agrees_with_the_character_scan(text, sep):
    # split_top_level takes a shortcut when there are no quotes; it must split exactly as the full scan
    assert split_top_level(text, sep) == split_by_characters(text, sep)


@given(st.lists(st.tuples(st.integers(0, 999_999_999), st.sampled_from(["", " ", "  "])), max_size=50))
def test_channel_lists_of_any_length_and_spacing(items):
    text = "(@" + ",".join(f"{pad}{n}{pad}" for n, pad in items) + ")"
    assert parse_channel_list(text) == [n for n, _ in items]


def test_numbers():
    assert parse_int("+5") == 5 and parse_int("5.0") == 5
    for bad in ["5.5", "x", "1e999", "nan"]:
        with pytest.raises(ScpiError):
            parse_int(bad)
    with pytest.raises(ScpiError):
        parse_float("inf")


def test_error_queue_fifo_and_overflow():
    src = ToySource()
    assert ask(src, ":SYST:ERR?") == ['0,"No error"\r\n']
    ask(src, "BOGUS")
    ask(src, "SOUR9:CURR 1")
    assert ask(src, "SYST:ERR:NEXT?")[0].startswith("-113,")
    assert ask(src, "SYSTEM:ERROR?")[0].startswith("-222,")
    for _ in range(40):
        ask(src, "BOGUS")
    assert ask(src, ":SYST:ERR:COUN?") == ["30\r\n"]
    queued = errors(src)
    assert queued == [-113] * 29 + [-350]


def test_error_all_drains_the_queue():
    src = ToySource()
    ask(src, "BOGUS;SOUR9:CURR 1")
    assert ask(src, ":SYST:ERR:ALL?") == ['-113,"Undefined header;BOGUS",-222,"Data out of range;no such channel"\r\n']
    assert ask(src, ":SYST:ERR:ALL?") == ['0,"No error"\r\n']


def test_esr_bits_per_error_class_and_cls():
    src = ToySource()
    ask(src, "BOGUS")  # -113 -> CME (32)
    ask(src, "SOUR9:CURR 1")  # -222 -> EXE (16)
    assert ask(src, "*ESR?") == ["48\r\n"]
    assert ask(src, "*ESR?") == ["0\r\n"]  # reading clears it
    src.push_error(-410)
    assert ask(src, "*ESR?") == ["4\r\n"]  # QYE
    ask(src, "BOGUS")
    ask(src, "*CLS")
    assert ask(src, "*ESR?;:SYST:ERR?") == ["0\r\n", '0,"No error"\r\n']


def test_ese_sre_stb():
    src = ToySource()
    ask(src, "*ESE 32;*SRE 32")
    assert ask(src, "*ESE?;*SRE?") == ["32\r\n", "32\r\n"]
    assert ask(src, "*STB?") == ["0\r\n"]
    ask(src, "BOGUS")
    assert ask(src, "*STB?") == [str(4 | 32 | 64) + "\r\n"]  # EAV, ESB, MSS
    ask(src, "*ESE 256")
    assert errors(src)[-1] == -222
    assert ask(src, "*TST?") == ["0\r\n"]


def test_opc_query_answers_when_operations_complete():
    src = ToySource()
    replies = src.handle(":SOUR1:CURR 1;*OPC?", 5.0)
    assert [(r.data, r.at) for r in replies] == [(b"1\r\n", pytest.approx(5.010))]


def test_opc_sets_the_esr_bit_only_once_complete():
    src = ToySource()
    src.handle(":SOUR1:CURR 1;*OPC", 1.0)
    assert src.handle("*ESR?", 1.005)[0].data == b"0\r\n"
    assert src.handle("*ESR?", 1.011)[0].data == b"1\r\n"


def test_wai_delays_later_answers_and_replies_keep_their_order():
    src = ToySource()
    replies = src.handle(":SOUR1:CURR 1;*WAI;*IDN?", 2.0)
    assert replies[0].at == pytest.approx(2.010)
    # an *OPC? then an *IDN? on the same session: IDN is ready at once but must not overtake
    replies = src.handle("SOUR1:CURR 2;*OPC?;*IDN?", 3.0)
    assert [r.at for r in replies] == [pytest.approx(3.010)] * 2
    assert replies[1].data.startswith(b"ACME")


def test_opc_query_holds_later_commands_of_the_message():
    src = ToySource()
    replies = src.handle(":SOUR1:CURR 1;*OPC?;:SOUR1:CURR 2;*OPC?", 0.0)
    # the second set runs when the first has settled, so it settles 10 ms after that
    assert [r.at for r in replies] == [pytest.approx(0.010), pytest.approx(0.020)]


def test_sessions_have_their_own_ordering():
    src = ToySource()
    a, b = src.new_session(), src.new_session()
    assert a.handle(":SOUR1:CURR 1;*OPC?", 0.0)[0].at == pytest.approx(0.010)
    assert b.handle("*IDN?", 0.001)[0].at == 0.001


def test_join_compound_option():
    src = ToySource(join_compound=True)
    replies = src.handle(":SOUR1:CURR 1;*OPC?;*IDN?;:SOUR1:CURR?", 0.0)
    assert len(replies) == 1
    assert replies[0].data == b"1;ACME,SRC4,1,0.1;1.000\r\n"
    assert replies[0].at == pytest.approx(0.010)


def test_empty_units_and_messages_are_ignored():
    src = ToySource()
    assert ask(src, "*IDN?;") == ["ACME,SRC4,1,0.1\r\n"]
    assert ask(src, ";;") == []
    assert ask(src, "   ") == []
    assert errors(src) == []


def test_query_interrupt_option():
    src = ToySource(query_interrupt=True)
    first = src.handle(":SOUR1:CURR 1;*OPC?", 0.0)[0]
    src.handle("*IDN?", 0.005)  # arrives while the *OPC? answer is still waiting to be sent
    assert first.cancelled
    assert errors(src, now=1.0) == [-410]
    done = src.handle("*OPC?", 2.0)[0]
    src.handle("*IDN?", 2.0)  # the earlier answer was already due: nothing to interrupt
    assert not done.cancelled
    assert errors(src, now=2.0) == []


def test_rst_resets_settings_but_not_the_error_queue():
    src = ToySource()
    ask(src, ":SOUR2:CURR 3;BOGUS")
    ask(src, "*RST")
    assert src.current[2] == 0.0
    assert errors(src) == [-113]


def test_never_raises_on_hostile_input():
    src = ToySource()
    for line in ["\x00\xff\x80", "(" * 10000, '"unterminated', ":" * 5000, "*", "?", "a" * 1_000_000, "9" * 5000]:
        src.handle(line, 0.0)
    src.handle(b"bytes are not str", 0.0)  # type: ignore[arg-type]
    assert ask(src, "*IDN?") == ["ACME,SRC4,1,0.1\r\n"]
