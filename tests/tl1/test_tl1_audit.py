"""drivers/tl1/audit.py, the TL1 drivers' models of their commands that `testbed check` replays audit logs
through, held to the emulated front ends: hand-written cases, then differential fuzzing (random command
sequences into a fresh switch through its TL1 front end, and through the model; the circuits must agree).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tl1_harness import Local

from drivers.audit import ALL_PORTS
from drivers.tl1.audit import CalientTl1AuditModel, PolatisTl1AuditModel, split_commands
from drivers.tl1.calient import aid_of

N = 4  # ingress 1..4, egress 5..8
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = {"polatis": PolatisTl1AuditModel, "calient": CalientTl1AuditModel}
_STATUS = re.compile(r"\r\nM  \S+ (COMPLD|DENY)\r\n(?:   ([A-Z]{4}))?")


def both(dialect: str, start: dict[int, int], lines: list[str]) -> tuple[dict[int, int], list[str]]:
    """The circuits after `lines` by the front end and by the model, which must agree; and the statuses."""
    switch = Local(dialect, N, circuits=sorted(start.items()))
    statuses = []
    for line in lines:
        out = switch.send(line + "\r\n")  # a tx record: the line break ends whatever the line left open
        statuses.append(" ".join("".join(m) for b in out for m in _STATUS.findall(b)))
    model = MODELS[dialect](N, sid="sw").replay(start, lines)
    assert model == switch.engine.circuits(), (lines, statuses)
    assert switch.frontend.internal_errors == []
    return model, statuses


# -- hand-written cases --------------------------------------------------------------------------------

POLATIS_CASES = [
    ({}, ["ENT-PATCH::1,5:1:;"], {1: 5}),
    ({}, ["ENT-PATCH::5,1:1:;"], {1: 5}),  # either order
    ({}, ["ent-patch::1&2,5&6:1:;"], {1: 5, 2: 6}),
    ({}, ["ENT-PATCH::1&&3,5&&7:1:;"], {1: 5, 2: 6, 3: 7}),
    ({}, ["ENT-PATCH::3&&1,5&&7:1:;"], {3: 5, 2: 6, 1: 7}),  # a range counted down
    ({}, ["ENT-PATCH:sw:1,5:1:;"], {1: 5}),  # the TID naming the switch
    ({}, ["ENT-PATCH::1,5:;"], {1: 5}),  # no CTAG: answered as 0
    ({}, ["ENT-PATCH::1,5:1234567:;"], {}),  # CTAG too long
    ({}, ["ENT-PATCH::1,5:1:"], {}),  # no `;`
    ({}, ["ENT-PATCH::1,5:1:;ENT-PATCH::2,6:2:;"], {1: 5, 2: 6}),  # two in one record
    ({1: 5}, ["ENT-PATCH::1,6:1:;"], {1: 6}),  # re-pointed
    ({1: 5}, ["ENT-PATCH::2,5:1:;"], {1: 5}),  # egress in use
    ({}, ["ENT-PATCH::1,2:1:;"], {}),  # two ingress ports
    ({}, ["ENT-PATCH::1&1,5&6:1:;"], {}),  # listed twice
    ({}, ["ENT-PATCH::1&2,5:1:;"], {}),  # lists of different length
    ({}, ["ENT-PATCH::1,9:1:;"], {}),  # out of range
    ({}, ['ENT-PATCH::1,5:1:"x;y";'], {1: 5}),  # a quoted `;` does not end it; the payload is ignored
    ({1: 5, 2: 6}, ["DLT-PATCH::6:1:;"], {1: 5}),
    ({1: 5, 2: 6}, ["DLT-PATCH::1&6:1:;"], {}),
    ({1: 5, 2: 6}, ["DLT-PATCH::all:1:;"], {}),
    ({1: 5}, ["DLT-PATCH:::1:;", "DLT-PATCH::9:2:;"], {1: 5}),
    ({1: 5}, ["OPR-PORT-SHUTTER::1:1:;", "RTRV-PATCH:::2:;"], {1: 5}),
]


@pytest.mark.parametrize(("start", "lines", "expected"), POLATIS_CASES)
def test_polatis_cases(start, lines, expected):
    assert both("polatis", start, lines)[0] == expected


A = [aid_of(k) for k in range(1, N + 1)]  # 1.1.1 .. 1.1.4
ENT, ACT, CANC, DLT = (f"{v}::{A[0]},{A[0]}:1::" for v in ("ENT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS"))
CALIENT_CASES = [
    ({}, [f"{ENT}g,1WAY;"], {}),  # entered only
    ({}, [f"{ENT}g,1WAY;", f"{ACT}{A[0]}>{A[0]},g;"], {1: 5}),
    ({}, [f"{ENT};", f"{ACT};"], {1: 5}),  # the type defaults to 1WAY; ACT's parameters are not read
    ({}, [f"{ENT}g,2WAY;", f"{ACT};"], {}),
    ({}, [f"{ENT}bad group,1WAY;", f"{ACT};"], {}),
    ({}, [f"{ACT};"], {}),  # not entered
    ({1: 5}, [f"{CANC};"], {}),
    ({1: 5}, [f"{DLT};"], {1: 5}),  # active: CANC-CRS first
    ({1: 5}, [f"{CANC};", f"{DLT};", f"{ACT};"], {}),
    ({1: 5}, [f"{CANC};", f"{ACT};"], {1: 5}),  # cancelled, then activated again
    ({1: 6}, [f"{ENT};"], {1: 6}),  # the input of 1.1.1 is taken
    ({2: 5}, [f"{ENT};", f"{ACT};"], {2: 5}),  # the output of 1.1.1 is taken
    ({}, [f"ENT-CRS::{A[0]},1.1.9:1::g,1WAY;", "ACT-CRS::1.1.1,1.1.9:2::;"], {}),
    ({}, ["ENT-CRS::1.1.1,1.1.2:;", "ACT-CRS::1.1.1,1.1.2:;"], {1: 6}),  # no CTAG at all
    ({}, [f"ENT-CRS::{A[3]},{A[1]}:1::g,1WAY;ACT-CRS::{A[3]},{A[1]}:2::;"], {4: 6}),
]


@pytest.mark.parametrize(("start", "lines", "expected"), CALIENT_CASES)
def test_calient_cases(start, lines, expected):
    assert both("calient", start, lines)[0] == expected


def test_writes_name_the_ports_they_touch():
    polatis, calient = PolatisTl1AuditModel(N), CalientTl1AuditModel(N)
    assert [w.ports for w in polatis.writes("ENT-PATCH::1&&3,5&&7:1:;\r\n")] == [frozenset({1, 2, 3, 5, 6, 7})]
    assert [w.ports for w in polatis.writes("DLT-PATCH::ALL:1:;")] == [ALL_PORTS]
    assert [w.ports for w in polatis.writes("RLS-PORT-SHUTTER::2:1:;RTRV-PATCH:::2:;")] == [frozenset({2})]
    assert [w.ports for w in polatis.writes("ENT-PATCH::1,99:1:;")] == [frozenset({1, 99})]  # not range-checked
    assert polatis.writes("ACT-USER::admin:1::***;") == []
    assert [w.ports for w in calient.writes(f"ENT-CRS::{A[1]},{A[2]}:1::g,1WAY;")] == [frozenset({2, N + 3})]
    assert [w.ports for w in calient.writes(f"ED-PORT::{A[0]}&{A[1]}:1:::OUTAS=OOS;")] == [frozenset({5, 6})]
    assert [w.command for w in calient.writes(f"DLT-CRS::{A[0]},{A[1]}:1::;\r\n")] == [f"DLT-CRS::{A[0]},{A[1]}:1::"]


def test_splitting_follows_the_switch():
    assert split_commands('A:::1:"x;y";B:::2:;\r\nC:::3:\nD:::4:;') == ['A:::1:"x;y"', "B:::2:", "D:::4:"]


# -- differential fuzzing ------------------------------------------------------------------------------

# Mostly commands the switch accepts (else the circuits never change and nothing is compared), with every
# kind of mistake mixed in.
port = st.one_of(st.integers(1, 2 * N), st.integers(0, 2 * N + 1))
ingress, egress = st.integers(1, N), st.integers(N + 1, 2 * N)


def joined(ports) -> st.SearchStrategy[str]:
    return st.one_of(
        ports.map(str),
        st.lists(ports, min_size=1, max_size=3).map(lambda ps: "&".join(map(str, ps))),
        st.tuples(ports, ports).map(lambda r: f"{r[0]}&&{r[1]}"),
    )


port_list = st.one_of(
    joined(port), st.sampled_from(["ALL", "all", "", " 1 ", "1&", "&1", "1&&&2", "x", '"1"', "99999999999"])
)
patch = st.one_of(
    st.tuples(joined(ingress), joined(egress)).map(",".join),
    st.tuples(ingress, egress).map(lambda p: f"{p[1]},{p[0]}"),
    st.tuples(port_list, port_list).map(",".join),
    port_list,
)
ctag = st.sampled_from(["1", "1", "1", "", "42", "abc123", "1234567", "a-b", " 7 "])
tail = st.sampled_from([":", ":", ":", "", "::", ':"x;y"', ":\t:"])
end = st.sampled_from([";", ";", ";", ";", ";", "", ";;", '";', "\n;"])


def command(verbs, aid) -> st.SearchStrategy[str]:
    return st.builds(
        lambda verb, tid, a, c, t, e: f"{verb}:{tid}:{a}:{c}{t}{e}",
        st.sampled_from(verbs),
        st.sampled_from(["", "", "", "sw"]),
        aid,
        ctag,
        tail,
        end,
    )


POLATIS_VERBS = ["ENT-PATCH", "ENT-PATCH", "ent-patch", "DLT-PATCH", "DLT-PATCH", "RTRV-PATCH", "OPR-PORT-SHUTTER"]
clean_patch = st.builds(
    lambda verb, p: f"{verb}::{p}:1:;",
    st.sampled_from(["ENT-PATCH", "ENT-PATCH", "DLT-PATCH"]),
    st.one_of(st.tuples(joined(ingress), joined(egress)).map(",".join), joined(port)),
)


def mostly(clean: st.SearchStrategy[str], messy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """7 lines in 10 from `clean` (one_of alone draws the simple branches far more often than the others)."""
    return st.integers(0, 9).flatmap(lambda k: clean if k < 7 else messy)


polatis_line = mostly(
    clean_patch,
    st.one_of(
        command(POLATIS_VERBS, patch),
        command(POLATIS_VERBS, patch),
        command(["ENT-PATCHX", "RTRV-HDR"], patch),
        st.lists(command(POLATIS_VERBS, patch), max_size=3).map("".join),
        st.text(alphabet='ENT-PATCH:DL,&;"1256\r\n \x00é', max_size=40),
    ),
)

aid = st.sampled_from([*A, *A, *A, "1.1.5", "2.1.1", "1.9.1", "0.1.1", "x", "01.1.2", ""])
calient_pair = st.tuples(aid, aid).map(",".join)
params = st.sampled_from(["g,1WAY", "g,1WAY", "g,1way", "", "g", ",g,name", "g,2WAY", "bad group,1WAY", '"q",1WAY'])
CALIENT_VERBS = ["ENT-CRS", "ENT-CRS", "ACT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS", "act-crs", "RTRV-CRS"]
clean_crs = st.builds(
    lambda verb, s, d: f"{verb}::{s},{d}:1::g,1WAY;",
    st.sampled_from(["ENT-CRS", "ACT-CRS", "ACT-CRS", "CANC-CRS", "DLT-CRS"]),
    st.sampled_from(A[:3]),
    st.sampled_from(A[:3]),
)
calient_line = mostly(
    clean_crs,
    st.one_of(
        st.builds(
            lambda v, p, c, par, e: f"{v}::{p}:{c}::{par}{e}",
            st.sampled_from(CALIENT_VERBS),
            calient_pair,
            ctag,
            params,
            end,
        ),
        command([*CALIENT_VERBS, "ENT-CRSX"], calient_pair),
        command(["ED-PORT"], st.lists(aid, min_size=1, max_size=3).map("&".join)),
        st.text(alphabet='ENT-CRSACT:.1,;"\r\n ', max_size=40),
    ),
)


def start_circuits(n: int) -> st.SearchStrategy[dict[int, int]]:
    """Circuits a switch can hold: a partial one-to-one map of ingress 1..n to egress n+1..2n."""
    return st.permutations(range(n + 1, 2 * n + 1)).flatmap(
        lambda perm: st.sets(st.integers(1, n)).map(lambda keep: {i: perm[i - 1] for i in sorted(keep)})
    )


@FUZZ
@given(start_circuits(N), st.lists(polatis_line, min_size=3, max_size=20))
def test_polatis_model_agrees_with_the_front_end(start, lines):
    both("polatis", start, lines)


@FUZZ
@given(start_circuits(N), st.lists(calient_line, min_size=5, max_size=25))
def test_calient_model_agrees_with_the_front_end(start, lines):
    both("calient", start, lines)


@FUZZ
@given(st.lists(st.one_of(polatis_line, calient_line), min_size=1, max_size=10))
def test_accepted_writes_name_ports_of_the_switch(lines):
    """For a write the switch answered COMPLD, the model names exactly one write, on the switch's ports."""
    for dialect, switch in (("polatis", Local("polatis", N)), ("calient", Local("calient", N))):
        model = MODELS[dialect](N)
        for line in lines:
            out = switch.send(line + "\r\n")
            accepted = [b for b in out if " COMPLD\r\n" in b]
            writes = model.writes(line)
            if len(accepted) == len([c for c in split_commands(line) if c.strip()]) == len(writes) == 1:
                (w,) = writes
                assert w.ports is ALL_PORTS or all(1 <= p <= 2 * N for p in w.ports), (line, w)
