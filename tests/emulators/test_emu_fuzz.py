"""Property tests: no input, however malformed, makes the engine raise or lose its wits."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.endpoints import LineChannel
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec

IDN = OcsSpec("x").idn

# Fragments of real commands, so that random lines reach deep into the parser and the handlers.
VOCABULARY = [
    ":", ";", "?", " ", ",", "(", ")", "(@", "@", '"', "'", "\t", "*", "#",
    "OXC", "oxc", "SWITch", "SWIT", "CONN", "CONNect", "ADD", "ONLY", "SUB", "STAT?", "STATe?",
    "PORT?", "PORT", "DIS", "ENAB", "DISC", "ALL", "SIZE?", "PMON", "POW?", "BOOT", "MODE", "MODE?",
    "SYST", "ERR?", "ERR", "ALL?", "NEXT?", "COMM", "NETW2", "ADDR?",
    "*IDN?", "*RST", "*CLS", "*OPC", "*OPC?", "*WAI", "*ESR?", "*ESE", "*SRE", "*STB?", "*TST?",
    "0", "1", "2", "16", "17", "32", "33", "64", "65", "-1", "1:4", "4:1", "1e3", "9" * 30,
    "(@)", "(@1,2)", "(@33,34)", "(@1:3)", "DARK", "REST", "\x00", "\xff", "é",
]  # fmt: skip

lines = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.lists(st.sampled_from(VOCABULARY), max_size=40).map("".join),
)


def make() -> PolatisEngine:
    return PolatisEngine(OcsSpec("fuzz", size=32, jitter_ms=0.5, input_power_dbm={1: -3.0}))


def check_invariants(ocs: PolatisEngine) -> None:
    egress = list(ocs.conn.values())
    assert len(egress) == len(set(egress)), "one egress serves two ingress ports"
    assert all(1 <= i <= 32 and 33 <= e <= 64 for i, e in ocs.conn.items())
    assert len(ocs.errors) <= ocs.error_queue_size
    # -300 is what the engine queues when a handler raised something other than ScpiError: a bug.
    assert not [text for code, text in ocs.errors if code == -300]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, min_size=1, max_size=8))
def test_engine_never_raises_and_still_answers_idn(batch):
    ocs = make()
    session = ocs.new_session()
    now = 0.0
    for line in batch:
        now += 0.001
        session.handle(line, now)  # must not raise
        check_invariants(ocs)
    replies = session.handle("*IDN?", now + 0.001)
    assert [r.data for r in replies] == [IDN.encode() + b"\r\n"]


class FakeLoop:
    """Just enough of an event loop for LineChannel: a frozen clock and a timer list."""

    def __init__(self) -> None:
        self.timers: list[float] = []

    def time(self) -> float:
        return 1000.0

    def call_at(self, when, callback):
        self.timers.append(when)
        return _Handle()


class _Handle:
    def cancel(self) -> None:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=10))
def test_line_channel_survives_any_byte_stream(chunks):
    ocs = make()
    out: list[bytes] = []
    channel = LineChannel(ocs, out.append, FakeLoop())
    for chunk in chunks:
        channel.feed(chunk)
    out.clear()
    channel.feed(b"\n*IDN?\r\n")  # a terminator first ends whatever partial line was pending
    assert out and out[-1].endswith(IDN.encode() + b"\r\n")


def test_line_channel_terminators_and_overrun():
    ocs = make()
    out: list[bytes] = []
    channel = LineChannel(ocs, out.append, FakeLoop())
    channel.feed(b"*IDN?\n*IDN?\r\n*IDN?\r*ID")
    channel.feed(b"N?\n")
    assert out == [IDN.encode() + b"\r\n"] * 4
    out.clear()
    channel.feed(b"A" * 70_000)  # longer than MAX_LINE without a terminator: dropped, -363 queued
    channel.feed(b"BBB\n:SYST:ERR?\n")  # the rest of the over-long line is dropped as well
    assert out == [b'-363,"Input buffer overrun;line too long"\r\n']
