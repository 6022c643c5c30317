"""Property tests for the photonic chip's two front ends: the Qontrol line protocol (emulators/mesh/
qontrol.py) and the SCPI multi-channel source (emulators/mesh/scpi_source.py). No input, however
malformed, makes them raise, hang or put the chip in a state no real driver board could (a NaN drive, a
level beyond its limits); a line they do not understand gets an error answer; and they still answer
their identification afterwards. Directly on the protocol engines, and through the twin's real pty and
TCP endpoints.
"""

from __future__ import annotations

import math
import os
import re
import select
import socket
import time
from collections.abc import Iterator

import pytest
import serial
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from emulators.mesh.chip import MeshChip
from emulators.mesh.qontrol import E_UNKNOWN_CMD, QontrolEngine
from emulators.mesh.scpi_source import MeshScpiEngine
from emulators.mesh.spec import MeshSpec
from emulators.spec import TwinSpec
from emulators.twin import TwinProcess

SPEC = MeshSpec("fuzz", size=4, seed=11, input_power_dbm={1: 0.0, 2: -3.0})
HUGE = "9" * 5000  # int() refuses strings this long

QONTROL_WORDS = [
    "v", "i", "vmax", "imax", "vall", "iall", "vipall", "vvec", "ivec", "id", "nup", "nupall", "nchan",
    "vfull", "ifull", "firmware", "pdp", "pdpall", "lifetime", "help", "V", "I", "ID",
    "?", "=", " ", ",", "0", "1", "7", "23", "24", "-1", "1.5", "12", "24.0", "nan", "NaN", "inf", "-inf",
    "1e400", "1e-400", HUGE, "٣", "²", "\x00", "\xff", "\t",
]  # fmt: skip
SCPI_WORDS = [
    ":", ";", "?", " ", ",", "(@", ")", "@", '"', "'", "*",
    "SOUR", "SOURce", "SOUR1", "SOUR24", "SOUR25", "SOUR0", "SOUR999999", "VOLT", "VOLTage", "CURR",
    "CURRent", ":LEV", "LEVel", "MEAS", "MEASure", "POW", "POWer", "CHAN", "CHANnel", "COUN?", ":MESH:SIZE?",
    "*OPC?", "*RST", "*IDN?", "*CLS", "*WAI", ":SYST:ERR?", "SYST:ERR:ALL?",
    "0", "1", "0.005", "0.024", "0.025", "12", "12.1", "-1", "nan", "inf", "1e9", "1:24", "24:1", "1:99",
    "(@1,2)", "(@1:8)", "(@5:8)", "(@)", "9" * 30, "\x00", "\xff",
]  # fmt: skip


def lines_of(words: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=120),
        st.binary(max_size=120).map(lambda b: b.decode("latin-1")),
        st.lists(st.sampled_from(words), max_size=14).map("".join),
    )


def check_chip(chip: MeshChip, vmax: float = 12.0, imax_ma: float = 24.0) -> None:
    assert all(math.isfinite(x) for x in chip.level), "a non-finite drive reached the chip"
    for h in range(chip.heaters):
        assert 0 <= chip.voltage(h) <= vmax + 1e-9 and 0 <= chip.current_ma(h) <= imax_ma + 1e-9


# --- the Qontrol line protocol -------------------------------------------------------------------------

ERROR_LINE = re.compile(r"^E\d\d:\d{2,6}$")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines_of(QONTROL_WORDS), min_size=1, max_size=8))
@example(["i0=nan"])  # a NaN passed every limit check and reached the chip
@example(["v1 = nan", "ivec=1,nan,2"])
@example([f"nup{HUGE}?"])  # int() of the channel digits raised
@example([f"v{HUGE}=1"])
def test_qontrol_engine_never_raises_and_still_identifies(batch):
    engine = QontrolEngine(MeshChip(SPEC))
    session = engine.new_session()
    now = 0.0
    for line in batch:
        now += 0.001
        replies = session.handle(line, now)  # must not raise
        assert len(replies) <= 1
        for reply in replies:
            text = reply.data.decode("ascii")  # ASCII only, whatever came in
            assert text.endswith("\n") and all(" " <= c < "\x7f" for c in text.replace("\n", ""))
        check_chip(engine.chip)
    assert [r.data for r in session.handle("id?", now + 0.001)] == [b"Q8iv-0A1B\n"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="=?"), max_size=60).filter(lambda s: s.strip()))
def test_a_line_without_a_command_gets_the_unrecognised_command_error(line):
    session = QontrolEngine(MeshChip(SPEC)).new_session()
    replies = session.handle(line, 1.0)
    if line.strip().lower() == "help":
        return
    assert [r.data for r in replies] == [f"E{E_UNKNOWN_CMD:02d}:00\n".encode()]


@pytest.mark.parametrize(
    "line", ["i0=nan", "v0=NaN", "i0=inf", "v0=-1", "ivec=1,nan", "vvec=0.5,inf", "imax0=nan", "i0=", "i0=abc"]
)
def test_a_bad_value_is_refused_with_an_error_line_and_changes_nothing(line):
    engine = QontrolEngine(MeshChip(SPEC))
    before = engine.chip.level.copy()
    (reply,) = engine.new_session().handle(line, 1.0)
    assert ERROR_LINE.match(reply.data.decode().strip()), reply
    assert (engine.chip.level == before).all() and engine.imax[0] == 24.0


# --- the SCPI source ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines_of(SCPI_WORDS), min_size=1, max_size=8))
@example(["SOUR1:CURR nan", "SOUR2:VOLT inf", "SOUR3:CURR 0.5"])
@example(["MEAS:POW? (@1:999999999)", "MEAS:VOLT? (@0)", "SOUR999999999:CURR 0"])
def test_scpi_source_never_raises_and_still_identifies(batch):
    chip = MeshChip(SPEC)
    engine = MeshScpiEngine(chip, SPEC.idn)
    session = engine.new_session()
    now = 0.0
    for line in batch:
        now += 0.001
        session.handle(line, now)  # must not raise
        check_chip(chip)
        assert len(engine.errors) <= engine.error_queue_size
        # -300 is what the engine queues when a handler raised something other than ScpiError: a bug.
        assert not [text for code, text in engine.errors if code == -300]
    replies = session.handle("*IDN?", now + 1.0)
    assert [r.data for r in replies] == [SPEC.idn.encode() + b"\n"]


# --- through the real endpoints of a twin ------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess(TwinSpec([SPEC])) as tw:
        yield tw


def read_until(read, marker: bytes, timeout: float = 5.0) -> bytes:
    """Read until `marker` has come (or fail after `timeout`: the endpoint stopped answering)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while marker not in buf:
        assert time.monotonic() < deadline, f"no {marker!r} after garbage; got {buf[-200:]!r}"
        buf += read()
    return buf


garbage = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(QONTROL_WORDS + SCPI_WORDS + ["\n", "\r", "\r\n"]), max_size=30).map(
        lambda words: "".join(words).encode("latin-1", "replace")
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage)
@example(b"A" * 70_000)  # longer than the endpoint's line limit
def test_the_qontrol_pty_survives_garbage(twin, data):
    with serial.Serial(twin.endpoints.devices["fuzz"]["qontrol"], timeout=0.05) as port:
        port.reset_input_buffer()
        port.write(data + b"\nid?\n")
        read_until(lambda: port.read(4096), b"Q8iv-0A1B\n")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage)
def test_the_scpi_source_on_tcp_survives_garbage(twin, data):
    host, port = twin.endpoints.devices["fuzz"]["tcp"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data + b"\n*IDN?\n")

        def read() -> bytes:
            ready, _, _ = select.select([sock], [], [], 0.05)
            chunk = sock.recv(65536) if ready else b""
            assert chunk or not ready, "the source closed the connection"
            return chunk

        read_until(read, SPEC.idn.encode() + b"\n")


def test_the_twin_process_is_still_serving(twin):
    assert twin.control.ping() and twin.process.poll() is None
    assert os.path.exists(twin.endpoints.devices["fuzz"]["qontrol"])
