"""The lease rules a shared lab relies on, case by case (testbed/leases/table.py), and the lease file's and the
duration's parsers under arbitrary input.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.cli.leases import parse_duration, resolve_targets
from testbed.contracts.errors import UserError
from testbed.leases.table import Holder, LeaseTable, Refused

ALICE = Holder("alice", "ctrl-a", 100)
ALICE_RUN = Holder("alice", "ctrl-b", 200, run="r1")
ALICE_RUN2 = Holder("alice", "ctrl-a", 300, run="r2")
BOB_RUN = Holder("bob", "ctrl-b", 400, run="r3")
OCS = {"ocs1": "TCPIP0::10.0.0.5::5025::SOCKET"}
BOTH = {**OCS, "gpu01": "gpu01.lab:22"}

# (first lease: holder, kind), (second: holder, kind), whether the second is refused
CASES = [
    ((ALICE, "reservation"), (BOB_RUN, "run"), True),  # another user's reservation keeps the device theirs
    ((ALICE, "reservation"), (ALICE_RUN, "run"), False),  # the holder's own runs go ahead
    ((ALICE_RUN, "run"), (ALICE_RUN2, "run"), True),  # two runs never at once, even one user's
    ((ALICE_RUN, "run"), (BOB_RUN, "run"), True),
    ((BOB_RUN, "run"), (ALICE, "reservation"), True),  # no reserving what another user's run drives
    ((ALICE_RUN, "run"), (ALICE, "reservation"), False),  # reserving beyond one's own run
    ((ALICE, "reservation"), (ALICE, "reservation"), False),  # taken again: replaced
]


@pytest.mark.parametrize(("first", "second", "refused"), CASES)
def test_who_may_take_a_device_another_lease_is_on(first, second, refused):
    table = LeaseTable()
    assert not isinstance(table.acquire(OCS, first[0], first[1], 3600, now=1000.0), Refused)
    result = table.acquire(OCS, second[0], second[1], 60, now=1001.0)
    assert isinstance(result, Refused) == refused
    if refused:
        assert [lease.holder for lease in result.blocking] == [first[0]]


def test_a_reservation_taken_again_replaces_the_old_one():
    table = LeaseTable()
    table.acquire(OCS, ALICE, "reservation", 3600, now=0.0, note="first")
    table.acquire(OCS, ALICE, "reservation", 60, now=10.0, note="second")
    assert [(lease.until, lease.note) for lease in table.leases] == [(70.0, "second")]


def test_all_or_nothing_and_conflicts_by_identity_not_name():
    table = LeaseTable()
    table.acquire({"switch-a": OCS["ocs1"]}, BOB_RUN, "run", 60, now=0.0)  # another inventory's name for it
    result = table.acquire(BOTH, ALICE_RUN, "run", 60, now=1.0)
    assert isinstance(result, Refused) and result.blocking[0].device == "switch-a"
    assert [lease.device for lease in table.leases] == ["switch-a"]  # gpu01 was not taken either


def test_a_lease_ends_on_its_own_and_renewal_extends_only_live_leases():
    table = LeaseTable()
    (lease,) = table.acquire(OCS, ALICE_RUN, "run", 60, now=0.0)
    assert [r.until for r in table.renew([lease.id], 60, now=50.0)] == [110.0]
    assert isinstance(table.acquire(OCS, BOB_RUN, "run", 60, now=109.0), Refused)
    taken = table.acquire(OCS, BOB_RUN, "run", 60, now=110.0)  # expired: nobody announced it
    assert not isinstance(taken, Refused)
    assert table.renew([lease.id], 60, now=111.0) == []  # a lapsed lease is not brought back


def test_release_by_id_and_a_users_reservations():
    table = LeaseTable()
    (run,) = table.acquire(OCS, BOB_RUN, "run", 60, now=0.0)
    table.acquire({"gpu01": "gpu01.lab:22", "gpu02": "gpu02.lab:22"}, ALICE, "reservation", 600, now=0.0)
    assert [lease.device for lease in table.release(user="alice", identities=["gpu02.lab:22"])] == ["gpu02"]
    assert table.release(user="alice", identities=[OCS["ocs1"]]) == []  # bob's run is not alice's to release
    assert [lease.id for lease in table.release(ids=[run.id])] == [run.id]
    assert [lease.device for lease in table.leases] == ["gpu01"]


def test_the_table_survives_its_file():
    table = LeaseTable()
    table.acquire(BOTH, ALICE_RUN, "run", 60, now=5.0, note="sweep")
    again = LeaseTable.from_json(json.loads(json.dumps(table.to_json())))
    assert again.leases == table.leases


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


GOOD = LeaseTable()
GOOD.acquire(BOTH, ALICE_RUN, "run", 60, now=5.0)
GOOD_JSON = GOOD.to_json()


def _tables():
    """A valid table with one value anywhere in it replaced by arbitrary JSON, or arbitrary JSON."""

    def mutate(args):
        where, key, value = args
        data = json.loads(json.dumps(GOOD_JSON))
        lease = data["leases"][where % len(data["leases"])]
        target = lease["holder"] if key.startswith("holder.") else lease
        target[key.removeprefix("holder.")] = value
        return data

    keys = st.sampled_from(
        [
            "id",
            "device",
            "identity",
            "kind",
            "since",
            "until",
            "note",
            "holder.user",
            "holder.pid",
            "holder.run",
            "holder.host",
            "holder",
        ]
    )
    return json_values | st.tuples(st.integers(0, 5), keys, json_values).map(mutate)


@given(_tables())
def test_any_lease_file_is_a_table_of_well_typed_leases_or_a_clear_refusal(data):
    try:
        table = LeaseTable.from_json(data)
    except ValueError:
        return  # what FileLeaseStore turns into "the lease file ... is not a lease table"
    for lease in table.leases:
        assert isinstance(lease.holder.user, str) and isinstance(lease.until, float)
        assert lease.kind in ("reservation", "run")
        assert LeaseTable.from_json(LeaseTable([lease]).to_json()).leases == [lease]


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("1d", 86400), ("0.5h", 1800)]
)
def test_durations_as_users_write_them(text, seconds):
    assert parse_duration(text) == seconds


@given(st.text(max_size=12))
def test_any_duration_text_is_seconds_or_a_clear_error(text):
    try:
        seconds = parse_duration(text)
    except UserError as exc:
        assert "--for" in str(exc)
        return
    assert 0 < seconds <= 14 * 86400


def test_lease_targets_are_matched_against_the_inventory_under_its_caps(repo):
    from testbed.documents import load_inventory

    inventory = load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model
    hosts = sorted(n for n, d in inventory.devices.items() if d.kind == "gpu_host")
    assert list(resolve_targets([f"{hosts[0][:-2]}[{hosts[0][-2:]}:{hosts[1][-2:]}]"], inventory)) == hosts[:2]
    with pytest.raises(UserError, match="more than an inventory may hold"):
        resolve_targets(["gpu[0:999999999]"], inventory)  # refused at once: nothing is listed


def test_the_cluster_keeper_refuses_a_table_it_cannot_read_instead_of_starting_empty(tmp_path, monkeypatch):
    from testbed.leases.ray_store import FILE_NAME, LeaseKeeper

    monkeypatch.setenv("TESTBED_LEASE_DIR", str(tmp_path))
    (tmp_path / FILE_NAME).write_text('{"version": 2, "leases": [{"lease": {"id": 3}}]}')
    keeper = LeaseKeeper()
    for call in (keeper.leases, lambda: keeper.acquire(OCS, BOB_RUN, "run", 60)):
        with pytest.raises(RuntimeError, match=f"{tmp_path / FILE_NAME}.*cannot be read"):
            call()
    assert (tmp_path / FILE_NAME).exists()  # kept where it is, for a person to look at


def test_the_cluster_keeper_keeps_its_table_across_a_restart(tmp_path, monkeypatch):
    from testbed.leases.ray_store import LeaseKeeper

    monkeypatch.setenv("TESTBED_LEASE_DIR", str(tmp_path))
    (lease,) = LeaseKeeper().acquire(OCS, ALICE, "reservation", 3600, "evening")
    assert [kept.id for kept in LeaseKeeper().leases()] == [lease.id]
