"""drivers/netconf/audit.py, the model `testbed check` replays NETCONF audit logs through, against the emulator's
NETCONF server (emulators/netconf/server.py): hand-written cases first, then differential fuzzing. Both read
the same RPC text; they must agree on the circuits after every RPC, accepted or refused, and `writes()` must name
every port an accepted edit changed.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from drivers.audit import ALL_PORTS
from drivers.netconf.audit import PolatisNetconfAuditModel
from emulators.netconf.server import NetconfOptions, NetconfServer
from emulators.scpi.ocs import PolatisEngine
from emulators.spec import OcsSpec

N = 4  # ingress 1..4, egress 5..8
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"
FUZZ = settings(max_examples=200, deadline=None)


def rpc(body: str, message_id: bool = True) -> str:
    mid = ' message-id="7"' if message_id else ""
    return f'<rpc xmlns="{NC}"{mid}>{body}</rpc>'


def edit(config: str, default: str | None = None, target: str = "<running/>") -> str:
    default_op = f"<default-operation>{default}</default-operation>" if default is not None else ""
    return rpc(f"<edit-config><target>{target}</target>{default_op}<config>{config}</config></edit-config>")


def cc(pairs: str, op: str = "") -> str:
    return f'<cross-connects xmlns="{OPSW}" xmlns:nc="{NC}"{op}>{pairs}</cross-connects>'


def pair(i, e=None, op: str = "", name: str = "pair") -> str:
    egress = "" if e is None else f"<egress>{e}</egress>"
    return f"<{name}{op}><ingress>{i}</ingress>{egress}</{name}>"


def server_replay(start: dict[int, int], lines: list[str], revision: str = "2018-03-22") -> list[dict[int, int]]:
    """The circuits the emulator's server holds after each line, from `start`."""
    engine = PolatisEngine(OcsSpec(name="m", size=N, switching_time_ms=0, jitter_ms=0), clock=lambda: 0.0)
    engine.replace_circuits(sorted(start.items()), 0.0)
    session = NetconfServer(engine, NetconfOptions(revision=revision), clock=lambda: 0.0).new_session()
    session.base11 = True
    after = []
    for line in lines:
        before = engine.circuits()
        reply = session.handle(line.encode("utf-8"))
        assert reply.xml is not None and reply.xml.startswith(b"<?xml")
        after.append(engine.circuits())
        tag = re.search(rb"<error-tag>([^<]*)</error-tag>", reply.xml)
        if currently_in_test_context():  # what the fuzzing covered: --hypothesis-show-statistics
            event(tag.group(1).decode() if tag else ("ok, changed" if after[-1] != before else "ok, unchanged"))
    return after


def both(start: dict[int, int], lines: list[str], revision: str = "2018-03-22") -> dict[int, int]:
    model = PolatisNetconfAuditModel(N)
    states = server_replay(start, lines, revision)
    state = dict(start)
    for line, emulated in zip(lines, states, strict=True):
        before, state = state, model.replay(state, [line])
        assert state == emulated, (line, before)
        changed = set(before.items()) ^ set(state.items())
        if changed:  # an accepted edit: writes() names a port of every circuit it made or removed (a merge that
            # re-points an ingress names the ingress, not the egress it left), or every port of the switch
            (write,) = model.writes(line)
            ports = write.ports
            assert ports is ALL_PORTS or all({i, e} & ports for i, e in changed)
            assert ports is ALL_PORTS or ports <= set(range(1, 2 * N + 1))
    return state


DELETE = ' nc:operation="delete"'
CASES = [
    ({}, [edit(cc(pair(1, 5) + pair(2, 6)))], {1: 5, 2: 6}),
    ({1: 5}, [edit(cc(pair(1, 6)))], {1: 6}),  # merge re-points a connected ingress
    ({1: 5}, [edit(cc(pair(2, 5)))], {1: 5}),  # refused: egress 5 would carry two circuits
    ({1: 5}, [edit(cc(pair(1, None, DELETE) + pair(2, 5)))], {2: 5}),  # in order: the move is fine
    ({1: 5}, [edit(cc(pair(1, 6, DELETE)))], {1: 5}),  # refused: 1 is connected to 5, not 6
    ({1: 5}, [edit(cc(pair(3, None, DELETE)))], {1: 5}),  # refused: data-missing
    ({1: 5}, [edit(cc(pair(3, None, ' nc:operation="remove"')))], {1: 5}),  # remove: silently nothing
    ({1: 5}, [edit(cc(pair(1, 5, ' operation="delete"')))], {}),  # unqualified, as ONOS sends it
    ({1: 5}, [edit(cc(pair(1, 6, ' nc:operation="create"')))], {1: 5}),  # refused: data-exists
    ({1: 5, 2: 6}, [edit(cc(pair(3, 7), ' nc:operation="replace"'))], {3: 7}),
    ({1: 5, 2: 6}, [edit(cc("", ' nc:operation="replace"'))], {}),
    ({1: 5}, [edit(cc("", ' nc:operation="delete"'))], {}),
    ({}, [edit(cc("", ' nc:operation="delete"'))], {}),  # refused (nothing to delete), nothing either way
    ({1: 5, 2: 6}, [edit(cc(pair(3, 7)), default="replace")], {3: 7}),
    ({1: 5, 2: 6}, [edit("", default="replace")], {}),  # the config is the whole datastore
    ({1: 5}, [edit(cc(pair(1, 5)), default="none")], {1: 5}),  # none: navigation only
    ({1: 5}, [edit(cc(pair(2, 6)), default="none")], {1: 5}),  # refused: data-missing
    ({1: 5}, [edit(cc(pair(2, 6, ' nc:operation="merge"')), default="none")], {1: 5, 2: 6}),
    ({}, [edit(cc(pair(1, 9)))], {}),  # egress out of range
    ({}, [edit(cc(pair(0, 5)))], {}),
    ({}, [edit(cc(pair(1)))], {}),  # merge without egress: missing-element
    ({}, [edit(cc(pair("+1", 5)))], {}),
    ({}, [edit(cc(pair("٣", 7)))], {}),  # an Arabic-Indic three is no port number
    ({}, [edit(cc(pair(1, 5)), target="<candidate/>")], {}),
    ({}, [edit(cc(pair(1, 5)), default="bogus")], {}),
    ({}, [edit(cc(pair(1, 5), ' nc:operation="bogus"'))], {}),
    ({}, [edit(cc(pair(1, 5)) + f'<port-config xmlns="{OPSW}"/>')], {}),  # one refused part refuses it all
    ({}, [rpc(f"<edit-config><target><running/></target><config>{cc(pair(1, 5))}</config></edit-config>", False)], {}),
    ({}, ['<!DOCTYPE r [<!ENTITY p "1">]>' + edit(cc(pair("&p;", 5)))], {}),  # no DTDs, no entities
    ({}, [edit(cc(pair(1, 5))).replace("</rpc>", "")], {}),  # not well-formed
    ({1: 5}, [rpc(f'<port-set-state xmlns="{OPSW}"><port-disab>5</port-disab></port-set-state>')], {1: 5}),
    ({1: 5}, [rpc("<get/>"), rpc("<close-session/>")], {1: 5}),
]


@pytest.mark.parametrize(("start", "lines", "expected"), CASES)
def test_hand_written_cases(start, lines, expected):
    assert both(start, lines) == expected


def test_the_old_list_name():
    assert both({}, [edit(cc(pair(1, 5, name="pairs")))], revision="2017-02-09") == {1: 5}


def test_the_list_name_is_what_the_model_cannot_check():
    # The model reads `pair` and `pairs` alike (a line does not say the switch's revision; the driver sends the name
    # its switch announced); the switch takes only its own, and says which.
    line = edit(cc(pair(1, 5, name="pairs")))
    assert PolatisNetconfAuditModel(N).replay({}, [line]) == {1: 5}
    assert server_replay({}, [line]) == [{}]
    engine = PolatisEngine(OcsSpec(name="m", size=N))
    reply = NetconfServer(engine).new_session().handle(line.encode()).xml.decode()
    assert "<error-tag>unknown-element</error-tag>" in reply and "revision 2018-03-22 names the list 'pair'" in reply


def test_writes():
    model = PolatisNetconfAuditModel(N)
    (write,) = model.writes(edit(cc(pair(1, 5) + pair(2, 6, DELETE))))
    assert write.ports == frozenset({1, 2, 5, 6}) and "merge x1, delete x1" in write.command
    assert model.writes(edit(cc("", ' nc:operation="replace"')))[0].ports is ALL_PORTS
    assert model.writes(edit(cc(pair(1, 5)), default="replace"))[0].ports is ALL_PORTS
    assert model.writes(rpc(f'<port-set-state xmlns="{OPSW}"><port-enab>3</port-enab></port-set-state>')) == [
        model.writes(rpc(f'<port-set-state xmlns="{OPSW}"><port-enab> 3 </port-enab></port-set-state>'))[0]
    ]
    assert model.writes(rpc("<get/>")) == [] and model.writes("not xml") == []
    assert model.writes(edit(cc(pair(1, 99))))[0].ports == frozenset({1, 99})  # intent, unchecked


# -- differential fuzzing ----------------------------------------------------------------------------


@st.composite
def rarely(draw, common, rare, one_in: int = 25):
    """Mostly `common`, about one draw in `one_in` from `rare` (an edit has many leaves, and one bad leaf refuses it
    all). The rare pick sits mid-range: hypothesis favours the ends of an integer range.
    """
    return draw(rare) if draw(st.integers(0, one_in - 1)) == one_in // 2 else draw(common)


OPS = rarely(st.sampled_from(["", "", "merge", "replace", "create", "delete", "delete", "remove"]), st.just("bogus"))
ODD = st.one_of(st.integers(0, 2 * N + 1).map(str), st.sampled_from(["", " 3 ", "x", "007", "+2", "1.0"]))
INGRESS = rarely(st.integers(1, N).map(str), ODD)  # mostly ports the switch takes, some it refuses
EGRESS = rarely(st.integers(N + 1, 2 * N).map(str), ODD)


def _op_attr(op: str, qualified: bool) -> str:
    if not op:
        return ""
    return f' nc:operation="{op}"' if qualified else f' operation="{op}"'


EXTRA_LEAVES = st.sampled_from(["<label/>", '<egress nc:operation="delete">5</egress>'])


@st.composite
def pairs_xml(draw, name: str) -> str:
    out = []
    for _ in range(draw(rarely(st.integers(1, 4), st.just(0)))):
        op = _op_attr(draw(OPS), draw(st.booleans()))
        leaves = []
        if draw(rarely(st.just(True), st.just(False))):
            leaves.append(f"<ingress>{draw(INGRESS)}</ingress>")
        if draw(rarely(st.just(True), st.just(False), 6)):
            leaves.append(f"<egress>{draw(EGRESS)}</egress>")
        leaves.append(draw(rarely(st.just(""), EXTRA_LEAVES)))
        if draw(st.booleans()):
            leaves.reverse()
        entry = draw(rarely(st.just(name), st.sampled_from(["pairz", "port"])))
        out.append(f"<{entry}{op}>{''.join(leaves)}</{entry}>")
    return "".join(out)


OTHER_TOPS = st.sampled_from([f'<voa xmlns="{OPSW}"/>', '<x xmlns="urn:other"/>', "<cross-connects/>"])
OTHER_RPCS = st.sampled_from([rpc("<get/>"), "<rpc/>", "garbage", rpc("<commit/>")])


@st.composite
def rpcs(draw, name: str) -> str:
    kind = draw(rarely(st.just("edit"), st.sampled_from(["port-set-state", "other"]), 10))
    if kind == "port-set-state":
        return rpc(f'<port-set-state xmlns="{OPSW}"><port-enab>{draw(ODD)}</port-enab></port-set-state>')
    if kind == "other":
        return draw(OTHER_RPCS)
    tops = []
    for _ in range(draw(rarely(st.integers(1, 2), st.just(0)))):
        tops.append(draw(rarely(st.builds(cc, pairs_xml(name), st.builds(_op_attr, OPS, st.booleans())), OTHER_TOPS)))
    default = draw(rarely(st.sampled_from([None, None, "merge", "replace", "none"]), st.just("bogus")))
    target = draw(rarely(st.just("<running/>"), st.sampled_from(["<candidate/>", ""])))
    text = edit("".join(tops), default, target)
    if draw(rarely(st.just(False), st.just(True))):
        text = text.replace(' message-id="7"', "")
    if draw(rarely(st.just(False), st.just(True), 10)):
        text = text.replace("<config>", "<error-option>rollback-on-error</error-option><config>")
    return text


CIRCUITS = st.permutations(range(N + 1, 2 * N + 1)).flatmap(
    lambda egress: st.sets(st.integers(1, N)).map(lambda ins: {i: egress[i - 1] for i in ins})
)


@FUZZ
@given(start=CIRCUITS, lines=st.lists(rpcs("pair"), min_size=1, max_size=5))
def test_model_and_emulator_agree(start, lines):
    both(start, lines)


@settings(max_examples=60, deadline=None)
@given(start=CIRCUITS, lines=st.lists(rpcs("pairs"), min_size=1, max_size=4))
def test_model_and_emulator_agree_on_the_old_revision(start, lines):
    both(start, lines, revision="2017-02-09")
