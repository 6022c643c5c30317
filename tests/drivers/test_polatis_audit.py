"""drivers/scpi/audit.py, the driver's model of its SCPI that `testbed check` replays audit logs through.

It must agree with the emulator's engine (emulators/scpi/ocs.py) on the circuits any line leaves, valid or
not: hand-written cases first, then differential fuzzing against a fresh engine fed the same lines one
by one on one session (what check.py's `_replay` did with the engine).

`writes()` reports every unit that names a write, accepted or not (the audit is of what was sent), with
the ports it names where the switch reads ports, unchecked; so only for lines the engine accepts without
any error are those ports guaranteed to lie within 1..2*size.
"""

from __future__ import annotations

import copy
import functools
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drivers.scpi.audit import _ROOT, ALL_PORTS, PolatisAuditModel, Write
from drivers.scpi.polatis import PolatisScpi
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec

FUZZ = settings(max_examples=300, deadline=None)


def engine_replay(size: int, start: dict[int, int], lines: list[str]) -> tuple[dict[int, int], list[list[int]]]:
    """The circuits a fresh engine holds after `lines`, and the error codes each line raised (recorded as
    pushed: a `:SYST:ERR?` or `*CLS` later in the same line would empty the queue).
    """
    engine = PolatisEngine(OcsSpec(name="m", size=size, switching_time_ms=0, jitter_ms=0), clock=lambda: 0.0)
    engine.conn = dict(start)
    engine.conn_to = {e: i for i, e in start.items()}
    pushed: list[int] = []
    push_error = engine.push_error
    engine.push_error = lambda code, detail="": (pushed.append(code), push_error(code, detail))[1]
    session = engine.new_session()
    errors = []
    for line in lines:
        session.handle(line, 0.0)
        errors.append(pushed[:])
        pushed.clear()
    return dict(engine.conn), errors


def both(size: int, start: dict[int, int], lines: list[str]) -> tuple[dict[int, int], list[list[int]]]:
    """Replay through the model and the engine; they must agree, and the engine must not have crashed.
    Returns the circuits and the error codes the engine raised per line.
    """
    model = PolatisAuditModel(size).replay(start, lines)
    engine, errors = engine_replay(size, start, lines)
    assert model == engine, (lines, errors)
    # An internal error would make the engine a poor oracle. (From a start no switch can hold, a power
    # query may crash it, e.g. {6: 6} recurses in power_dbm: that says nothing about the circuits.)
    holdable = all(1 <= i <= size < e <= 2 * size for i, e in start.items()) and len(set(start.values())) == len(start)
    assert not (holdable and any(-300 in e for e in errors)), errors
    return model, errors


# -- hand-written cases (size 4: ingress 1..4, egress 5..8) ------------------------------------------

ADD = ":OXC:SWIT:CONN:ADD"
CASES = [
    # (start, lines, expected)
    ({}, [f"{ADD} (@1,2),(@5,6)"], {1: 5, 2: 6}),
    ({}, [":oxc:switch:connect:add (@1),(@5)"], {1: 5}),  # long form, lower case
    ({}, [":Oxc:SwitCH:Conn:aDd (@3),(@8)"], {3: 8}),
    ({}, ["OXC:SWIT:CONN:ADD (@1),(@5)"], {1: 5}),  # relative to the root at the start of a line
    ({}, [f"{ADD}\t(@ 1 , 2 ),( @5,6 )\r\n"], {1: 5, 2: 6}),  # tab, spaces, terminator
    ({1: 5}, [f"{ADD} (@1),(@6)"], {1: 6}),  # ADD re-points a connected ingress
    ({1: 5}, [f"{ADD} (@2),(@5)"], {1: 5}),  # refused: egress 5 already in use
    ({}, [f"{ADD} (@1,2),(@5,5)"], {}),  # refused: a port listed twice
    ({}, [f"{ADD} (@1,1),(@5,6)"], {}),
    ({}, [f"{ADD} (@1),(@5,6)"], {}),  # refused: more egress than ingress
    ({}, [f"{ADD} (@1,2),(@5)"], {}),  # refused: fewer egress
    ({}, [f"{ADD} (@1),(@9)"], {}),  # refused: egress out of range
    ({}, [f"{ADD} (@0),(@5)"], {}),
    ({}, [f"{ADD} (@5),(@6)"], {}),  # an egress port in the ingress list
    ({}, [f"{ADD} (@1),(@5),1"], {1: 5}),  # a third parameter is accepted and ignored
    ({}, [f"{ADD} (@1),(@5),1,2"], {}),  # a fourth is refused
    ({}, [f"{ADD} (@1),,(@5)"], {}),  # an empty parameter
    ({}, [f"{ADD} (@1;2),(@5)"], {}),  # ';' inside parentheses does not split the line
    ({}, [f"{ADD}? (@1),(@5)"], {}),  # the query form does not exist
    ({}, [f"{ADD} (@),(@)"], {}),
    ({}, [f"{ADD} (@1:3),(@5:7)"], {1: 5, 2: 6, 3: 7}),  # ranges
    ({}, [f"{ADD} (@3:1),(@5:7)"], {3: 5, 2: 6, 1: 7}),  # a falling range keeps its order
    ({}, [f"{ADD} (@1:2:3),(@5)"], {}),
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:SUB (@1),(@5)"], {2: 6}),
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:SUB (@1),(@6)"], {1: 5, 2: 6}),  # a pair not connected is ignored
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:SUB (@1,2)"], {}),  # ingress alone: whatever it is connected to
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:SUB (@1,1)"], {2: 6}),  # duplicates are fine without egress
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:SUB (@2),(@)"], {1: 5}),
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:ONLY (@3),(@7)"], {3: 7}),
    ({1: 5, 2: 6}, [":OXC:SWIT:CONN:ONLY (@3),(@9)"], {1: 5, 2: 6}),  # refused: nothing is dropped either
    ({1: 5, 2: 6}, [":OXC:SWIT:DISC:ALL"], {}),
    ({1: 5, 2: 6}, [":oxc:switch:disconnect:all"], {}),
    ({1: 5, 2: 6}, [":OXC:SWIT:DISC:ALL (@1)"], {1: 5, 2: 6}),  # takes no parameter
    ({1: 5}, ["*RST"], {}),
    ({1: 5}, ["*rst"], {}),
    ({1: 5}, ["*RST 1"], {1: 5}),
    ({1: 5}, ["*RST?"], {1: 5}),
    ({1: 5}, [":OXC:SWIT:PORT:DIS (@1,5)", ":OXC:SWIT:PORT:ENAB (@1:8)"], {1: 5}),  # enable state is no circuit
    ({}, [f"{ADD} (@1),(@5);ADD (@2),(@6);SUB (@1)"], {2: 6}),  # path memory within a line
    ({}, [":OXC:SWIT:CONN:STAT?;ADD (@1),(@5)"], {1: 5}),  # a query sets the path too
    ({}, [":OXC:SWIT:SIZE?;CONN:ADD (@1),(@5)"], {1: 5}),
    ({}, ["*OPC?;OXC:SWIT:CONN:ADD (@1),(@5)"], {1: 5}),  # a common command leaves the path at the root
    ({}, [":OXC:SWIT:CONN:FOO;ADD (@1),(@5)"], {}),  # an unknown header leaves the path at the root
    ({}, [":OXC:SWIT:CONN;ADD (@1),(@5)"], {}),  # a node without a command still moves the path
    ({}, [":SYST:ERR?;ADD (@1),(@5)"], {}),  # ADD is not under SYSTem
    ({}, ["ADD (@1),(@5)"], {}),  # the path does not survive the line
    ({}, [f"{ADD} (@1),(@5)", "ADD (@2),(@6)"], {1: 5}),
    ({}, [f"{ADD} (@2),(@7);;{ADD} (@1),(@5);"], {1: 5, 2: 7}),  # empty units are skipped
    ({}, [f"{ADD} '(@1)',(@5)"], {}),  # a quoted string is not a channel list
    # a quote or parenthesis left open swallows the rest of the line, ';' included
    ({1: 5}, [":OXC:BOOT:MODE ';:OXC:SWIT:DISC:ALL"], {1: 5}),
    ({1: 5}, [":OXC:BOOT:MODE 'a;b';:OXC:SWIT:DISC:ALL"], {}),
    ({1: 5}, [":OXC:BOOT:MODE \"a';:OXC:SWIT:DISC:ALL"], {1: 5}),  # only the same quote closes
    ({1: 5}, [":OXC:BOOT:MODE 'a''b';:OXC:SWIT:DISC:ALL"], {}),  # a doubled quote stays inside
    ({1: 5}, [":OXC:BOOT:MODE (;:OXC:SWIT:DISC:ALL"], {1: 5}),
    ({1: 5}, [":OXC:BOOT:MODE );:OXC:SWIT:DISC:ALL"], {}),
    ({1: 5}, [":OXC:BOOT:MODE ) (;:OXC:SWIT:DISC:ALL"], {1: 5}),  # a stray ')' does not pre-close a '('
    ({}, [":OXC:SWIT:CONN:PORT? 1;ADD (@1),(@5)"], {1: 5}),
    ({}, [":SYST:COMM:NETW2:ADDR?;OXC:SWIT:CONN:ADD (@1),(@5)"], {}),  # the path is NETWork now
    ({}, [f"{ADD} (@\u0661),(@5)"], {1: 5}),  # a Unicode digit is a digit to both
]


@pytest.mark.parametrize(("start", "lines", "expected"), CASES)
def test_hand_written_replay(start, lines, expected):
    assert both(4, start, lines)[0] == expected


def test_replay_does_not_touch_its_argument():
    start = {1: 5}
    PolatisAuditModel(4).replay(start, [":OXC:SWIT:DISC:ALL"])
    assert start == {1: 5}


def test_writes_hand_written():
    model = PolatisAuditModel(4)
    assert model.writes(f"{ADD} (@1,2),(@5,6)") == [Write(f"{ADD} (@1,2),(@5,6)", frozenset({1, 2, 5, 6}))]
    assert model.writes(f"{ADD} (@1),(@5); SUB (@2:3)\r\n") == [
        Write(f"{ADD} (@1),(@5)", frozenset({1, 5})),
        Write("SUB (@2:3)", frozenset({2, 3})),
    ]
    assert model.writes(":oxc:switch:disconnect:all") == [Write(":oxc:switch:disconnect:all", ALL_PORTS)]
    assert model.writes("*rst") == [Write("*rst", ALL_PORTS)]
    assert model.writes(":OXC:SWIT:PORT:DIS (@3:4)") == [Write(":OXC:SWIT:PORT:DIS (@3:4)", frozenset({3, 4}))]
    # refused, but sent: the stray port is reported for the interlock check to see
    assert model.writes(f"{ADD} (@1),(@99)")[0].ports == frozenset({1, 99})
    assert model.writes(f"{ADD} (@1),(@x)")[0].ports == frozenset({1})  # an unreadable list names nothing
    assert model.writes(f"{ADD} (@1),(@5),(@7)")[0].ports == frozenset({1, 5})  # the third is ignored
    assert model.writes(":OXC:BOOT:MODE DARK") == [Write(":OXC:BOOT:MODE DARK", frozenset())]
    for line in [":OXC:SWIT:CONN:STAT?", ":PMON:POW? (@1)", "*OPC?", "*CLS", "garbage", "", ";", f"{ADD}? (@1),(@5)"]:
        assert model.writes(line) == [], line


def test_all_ports_is_one_sentinel():
    assert copy.deepcopy(ALL_PORTS) is ALL_PORTS
    assert pickle.loads(pickle.dumps(Write("*RST", ALL_PORTS))).ports is ALL_PORTS
    assert repr(ALL_PORTS) == "ALL_PORTS"


def test_command_tree_is_the_engines():
    """Path memory makes a relative header depend on the whole tree; every set command must be known."""
    engine = PolatisEngine(OcsSpec(name="m", size=2))

    def shape(node, is_model: bool):
        children = sorted(shape(c, is_model) for c in node.children)
        has_set = (node.write is not None) if is_model else (node.set is not None)
        return (node.long, node.short, node.suffixed, has_set, tuple(children))

    assert shape(_ROOT, True) == shape(engine.root, False)
    # of the common commands only *RST touches the circuits; the others set status registers
    assert {h for h in engine.commons if not h.endswith("?")} == {"*RST", "*CLS", "*OPC", "*WAI", "*ESE", "*SRE"}


def test_size_must_be_positive():
    with pytest.raises(ValueError):
        PolatisAuditModel(0)


# -- differential fuzzing against the engine ---------------------------------------------------------

# Commands as the engine spells them (upper case = short form): (path, the parameters they take), weighted
# towards the circuit commands. The last node's parent is the path a following relative header starts from.
COMMANDS = [
    *[(("OXC", "SWITch", "CONNect", verb), "pairs") for verb in ("ADD", "ADD", "ONLY", "SUB", "SUB")],
    (("OXC", "SWITch", "CONNect", "STATe?"), ""),
    (("OXC", "SWITch", "CONNect", "PORT?"), "list"),
    (("OXC", "SWITch", "CONNect", "BOGus"), "pairs"),
    (("OXC", "SWITch", "CONNect"), "pairs"),  # a node without a command
    (("OXC", "SWITch", "DISConnect", "ALL"), ""),
    (("OXC", "SWITch", "PORT", "DISable"), "list"),
    (("OXC", "SWITch", "PORT", "ENABle"), "list"),
    (("OXC", "SWITch", "PORT", "STATe?"), "list"),
    (("OXC", "SWITch", "SIZE?"), ""),
    (("OXC", "BOOT", "MODE"), "mode"),
    (("PMON", "POWer?"), "list"),
    (("SYSTem", "ERRor?"), ""),
    (("SYSTem", "ERRor", "NEXT?"), ""),
    (("SYSTem", "COMMunicate", "NETWork2", "ADDRess?"), ""),
]
COMMONS = ["*RST", "*rst", "*RST?", "*OPC?", "*CLS", "*WAI", "*IDN?", "*FOO"]
# Text that tests the splitting of a line into units and parameters: quotes and stray parentheses.
JUNK = ["1", "DARK", "'a;b'", '"x,y"', "'", '"', "'", '"', "(", ")", ") (", "(@1", "1)", "(@x)", "(@1,,2)"]
JUNK += ["(1,2)", "\"x';", "'y\""]
JUNK += ["@1", "(@1:)", "(@1:2:3)", "(@-1)", "(@1.5)", "'(@1)'", "(@999999999)", "(@1:99999)", ""]


def spellings(node: str) -> list[str]:
    """Short form, long form in upper, lower and mixed case; a trailing '?' kept."""
    query = "?" if node.endswith("?") else ""
    word = node.rstrip("?")
    short = "".join(c for c in word if not c.islower())
    return sorted({w + query for w in (short, word.upper(), word.lower(), word)})


def fmt(ports: list[int], ranges: bool, spaced: bool) -> str:
    """A channel list, with runs of consecutive ports written as ranges (rising or falling) if asked."""
    items: list[str] = []
    i = 0
    while i < len(ports):
        j = i
        step = ports[i + 1] - ports[i] if i + 1 < len(ports) else 0
        while ranges and step in (1, -1) and j + 1 < len(ports) and ports[j + 1] - ports[j] == step:
            j += 1
        items.append(f"{ports[i]}:{ports[j]}" if j > i else str(ports[i]))
        i = j + 1
    return ("( @ " if spaced else "(@") + (" , " if spaced else ",").join(items) + ")"


# How a circuit command's lists go wrong (or not): most are right, so that most commands change something.
FLAWS = ["none"] * 6 + ["dup ingress", "dup egress", "more egress", "fewer egress", "no egress", "(@) egress"]
FLAWS += ["egress as ingress", "port 0", "third", "third", "fourth"]


def circuit_args(n: int) -> st.SearchStrategy[list[str]]:
    def build(t) -> list[str]:
        ing, eg, k, flaw, ranges, spaced = t
        ing, eg = list(ing[:k]), list(eg[:k])
        if flaw == "dup ingress" and k > 1:
            ing[1] = ing[0]
        elif flaw == "dup egress" and k > 1:
            eg[1] = eg[0]
        elif flaw == "more egress":
            eg.append(2 * n)
        elif flaw == "fewer egress":
            eg = eg[:-1]
        elif flaw == "egress as ingress" and k:
            ing[0] = n + 1
        elif flaw == "port 0" and k:
            ing[-1] = 0
        args = [fmt(ing, ranges, spaced), fmt(eg, ranges, spaced)]
        return {"no egress": args[:1], "(@) egress": [args[0], "(@)"], "third": [*args, "1"]}.get(
            flaw, [*args, "1", "2"] if flaw == "fourth" else args
        )

    ingress, egress = st.permutations(range(1, n + 1)), st.permutations(range(n + 1, 2 * n + 1))
    count = st.sampled_from([0, *range(1, n + 1), *range(1, n + 1)])
    return st.tuples(ingress, egress, count, st.sampled_from(FLAWS), st.booleans(), st.booleans()).map(build)


# Strategies are built once (per size): building them inside each draw costs hypothesis seconds.
SPELL = {w: st.sampled_from(spellings(w)) for path, _ in COMMANDS for w in path}
HOW = st.sampled_from(["absolute"] * 3 + ["leaf"] * 3 + ["tail"])  # leaf: relies on path memory
COLON = st.sampled_from([":", ":", ":", ""])
WHITE, COMMA, SEMI = (
    st.sampled_from([" ", "\t", "  "]),
    st.sampled_from([",", ", ", " ,"]),
    st.sampled_from([";", "; "]),
)
END = st.sampled_from(["", ";", "\n", "\r\n"])
JUNK_ARGS = st.lists(st.sampled_from(JUNK), min_size=1, max_size=3)


@functools.cache
def args_for(n: int) -> dict[str, st.SearchStrategy[list[str]]]:
    port_list = st.tuples(st.lists(st.integers(0, 2 * n + 1), max_size=n + 1), st.booleans(), st.booleans())
    return {
        "pairs": circuit_args(n),
        "list": port_list.map(lambda t: [fmt(*t)]),
        "mode": st.sampled_from(["DARK", "rest", "AUTosave", "bogus"]).map(lambda m: [m]),
        "": st.just([]),
    }


@st.composite
def lines(draw, n: int) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=40))  # anything at all
    units, parent = [], None  # parent: the path memory the previous unit left (roughly)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 7)) == 0:
            header, kind = draw(st.sampled_from(COMMONS)), ""  # a common command leaves the path alone
        else:
            path, kind = draw(st.sampled_from(COMMANDS))
            how = draw(HOW)
            if how == "leaf" and parent == path[:-1]:
                words, colon = path[-1:], ""
            elif how == "tail":
                words, colon = path[draw(st.integers(0, len(path) - 1)) :], draw(COLON)
            else:
                words, colon = path, draw(COLON)
            header, parent = colon + ":".join(draw(SPELL[w]) for w in words), path[:-1]
        args = draw(JUNK_ARGS) if draw(st.integers(0, 4)) == 0 else draw(args_for(n)[kind])
        units.append(header + (draw(WHITE) + draw(COMMA).join(args) if args else ""))
    return draw(SEMI).join(units) + draw(END)


def starts(size: int) -> st.SearchStrategy[dict[int, int]]:
    valid = st.tuples(st.lists(st.integers(1, size), unique=True), st.permutations(range(size + 1, 2 * size + 1))).map(
        lambda t: dict(zip(t[0], t[1], strict=False))
    )
    # a start the switch could not hold (an egress twice, ports reversed): the two must still agree
    odd = st.dictionaries(st.integers(1, 2 * size), st.integers(1, 2 * size), max_size=size)
    return st.one_of(*[valid] * 4, odd)


SIZES = range(1, 6)
PER_SIZE = {n: st.tuples(st.just(n), starts(n), st.lists(lines(n), max_size=8)) for n in SIZES}
scenarios = st.sampled_from(SIZES).flatmap(PER_SIZE.__getitem__)


@FUZZ
@given(scenarios)
def test_fuzzed_lines_agree_with_the_engine(scenario):
    """One generated run checks both properties (generation, not the check, is what costs here)."""
    size, start, sent = scenario
    _, errors = both(size, start, sent)
    # the writes of a line the engine accepted whole name only ports of the switch; a line with a
    # refused unit may name anything that was sent
    model = PolatisAuditModel(size)
    for line, line_errors in zip(sent, errors, strict=True):
        for write in [] if line_errors else model.writes(line):
            assert write.ports is ALL_PORTS or write.ports <= set(range(1, 2 * size + 1)), (line, write)


@FUZZ
@given(st.text(), st.integers(1, 8))
def test_writes_never_raise(text, size):
    for write in PolatisAuditModel(size).writes(text):
        assert isinstance(write, Write)


class Recorder:
    """The transport under the real driver: keeps every line it was asked to send."""

    address = "rec://polatis"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def write(self, message: str) -> None:
        self.sent.append(message + "\n")

    def query(self, message: str) -> str:
        return '0,"No error"'

    def close(self) -> None:
        pass


@st.composite
def driver_calls(draw):
    size = draw(st.integers(1, 6))
    port = st.integers(1, 2 * size)
    pairs = st.lists(st.tuples(port, port), max_size=size + 1)
    call = st.one_of(
        st.tuples(st.just("connect"), pairs),
        st.tuples(st.just("disconnect"), pairs),
        st.tuples(st.just("disconnect_all")),
        st.tuples(st.just("set_port_enabled"), st.lists(port, max_size=3), st.booleans()),
    )
    return size, draw(st.lists(call, max_size=10))


@FUZZ
@given(driver_calls())
def test_what_the_driver_sends(scenario):
    size, calls = scenario
    rec = Recorder()
    driver = PolatisScpi(rec, "ocs", check_errors=False)
    model = PolatisAuditModel(size)
    for name, *args in calls:
        before = len(rec.sent)
        getattr(driver, name)(*args)
        written = [w for line in rec.sent[before:] for w in model.writes(line)]
        if name == "disconnect_all":
            assert [w.ports for w in written] == [ALL_PORTS]
        elif args[0]:  # the driver sends nothing for no pairs / no ports
            named = {p for pair in args[0] for p in pair} if name != "set_port_enabled" else set(args[0])
            assert [w.ports for w in written] == [frozenset(named)]
    both(size, {}, rec.sent)
