"""This machine's lease folder against the other accounts of the machine (docs/leases.md, "Threat model"): one file
per lease, its holder's alone; nothing followed through a link; damage refuses the device it names; one device
named two ways is one device; a lease that lapsed stops the run that held it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from accounts import ALICE, BOB, MALLORY, as_account, needs_root, shared_folder

from testbed.config.switch_transports import Tl1Transport
from testbed.config.transports import SerialTransport, SshTransport, VisaTransport
from testbed.contracts.errors import UserError
from testbed.leases import HeldLeases, LeaseHeld, LeaseLapsed, acquire, held, me
from testbed.leases.file_store import LIFETIME_CAP_S, FileLeaseStore, LeaseFolderError, boot_clock, device_key
from testbed.leases.identity import device_identity, told_identity
from testbed.leases.table import Refused

SWITCH_AS_ADMIN = Tl1Transport(type="tl1", host="ocs1.lab.example.", port=3082, user="admin", password_env="P")
SWITCH_AS_ALICE = Tl1Transport(type="tl1", host="OCS1.lab.example", port=3082, user="alice", password_env="P")


@pytest.fixture
def folder():
    """A folder as /var/tmp is: root's, sticky, open to every account."""
    base = shared_folder()
    yield base
    for path in sorted(base.rglob("*"), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    base.rmdir()


def _take(folder: Path, identity: str, kind: str = "reservation", device: str = "ocs1"):
    return acquire(FileLeaseStore(folder), {device: identity}, me(), kind, 3600)


# --- identity ------------------------------------------------------------------------------------------------


def test_one_device_named_two_ways_is_one_identity():
    assert device_identity(SWITCH_AS_ADMIN) == device_identity(SWITCH_AS_ALICE)  # login user, case, trailing dot
    local = VisaTransport(type="visa", resource="TCPIP0::127.0.0.1::5025::SOCKET")
    named = VisaTransport(type="visa", resource="TCPIP::localhost::5025::SOCKET")
    socket_url = SerialTransport(type="serial", port="socket://localhost:5025")
    assert device_identity(local) == device_identity(named) == device_identity(socket_url) == "tcp://127.0.0.1:5025"
    ssh = [SshTransport(type="ssh", host=h, user=u) for h, u in (("127.0.0.1", "lab"), ("localhost.", "alice"))]
    assert device_identity(ssh[0]) == device_identity(ssh[1])
    other_port = VisaTransport(type="visa", resource="TCPIP0::127.0.0.1::5026::SOCKET")
    assert device_identity(other_port) != device_identity(local)


LOOPBACK_SPELLINGS = ("127.0.0.1", "127.0.0.2", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST.")
LOOPBACK_SPELLINGS += ("::ffff:127.0.0.1",)


def test_every_spelling_of_this_machine_is_one_host():
    """A switch (or an emulator) on this machine, reached as ::1 by one run and as 127.0.0.1 by another: one device."""
    spelled = {
        device_identity(Tl1Transport(type="tl1", host=host, port=3082, user="admin", password_env="P"))
        for host in (*LOOPBACK_SPELLINGS, "0.0.0.0", "::")  # a connection to these reaches this machine too
    }
    assert spelled == {"tl1://127.0.0.1:3082"}
    assert device_identity(Tl1Transport(type="tl1", host="10.0.0.5", user="a", password_env="P")) != spelled.pop()


@needs_root
def test_two_accounts_reaching_one_local_switch_as_ipv6_and_ipv4_loopback_get_one_lease(folder):
    as_v6 = Tl1Transport(type="tl1", host="::1", port=3082, user="alice", password_env="P")
    as_v4 = Tl1Transport(type="tl1", host="127.0.0.1", port=3082, user="bob", password_env="P")
    as_account(ALICE, _take, folder, device_identity(as_v6))
    with pytest.raises(LeaseHeld, match=f"reserved by {ALICE}@"):
        as_account(BOB, _take, folder, device_identity(as_v4), "run")


def test_a_serial_port_is_the_device_file_its_link_names(tmp_path):
    (tmp_path / "ttyUSB0").touch()
    (tmp_path / "by-id").symlink_to(tmp_path / "ttyUSB0")
    by_path = SerialTransport(type="serial", port=str(tmp_path / "ttyUSB0"))
    by_link = SerialTransport(type="serial", port=str(tmp_path / "by-id"))
    as_visa = VisaTransport(type="visa", resource=f"ASRL{tmp_path / 'by-id'}::INSTR")
    assert device_identity(by_path) == device_identity(by_link) == device_identity(as_visa)


def test_what_a_device_tells_at_identify_is_an_identity_when_it_tells_a_serial():
    told = {"vendor": "Polatis", "model": "N-OST-32x32", "serial": "SN4242", "firmware": "6.5"}
    assert told_identity(told) == "serial:polatis:n-ost-32x32:SN4242"
    assert told_identity({**told, "serial": ""}) is None
    assert told_identity({"vendor": "x"}) is None


# --- two accounts, one switch ---------------------------------------------------------------------------------


@needs_root
def test_two_users_contending_for_one_switch_named_two_ways_get_one_lease(folder):
    alice = as_account(ALICE, _take, folder, device_identity(SWITCH_AS_ALICE))
    assert [lease.holder.user for lease in alice] == [str(ALICE)]
    with pytest.raises(LeaseHeld) as refused:
        as_account(BOB, _take, folder, device_identity(SWITCH_AS_ADMIN), "run")
    assert f"reserved by {ALICE}@" in str(refused.value)
    assert "tl1://" in str(refused.value)  # the device, whatever the inventory called it


@needs_root
def test_another_account_can_neither_rewrite_nor_remove_a_lease(folder):
    (lease,) = as_account(ALICE, _take, folder, "tcp://10.0.0.5:5025")
    (path,) = folder.glob(f"testbed-lease-{device_key('tcp://10.0.0.5:5025')}-*.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.stat().st_uid == ALICE

    def tamper():
        with pytest.raises(PermissionError):
            open(path, "w")  # noqa: SIM115
        with pytest.raises(PermissionError):
            path.unlink()
        decoy = folder / f"decoy-{os.getpid()}"
        decoy.write_text("{}")
        with pytest.raises(PermissionError):
            os.rename(decoy, path)  # replacing it needs its owner, in a sticky folder
        decoy.unlink()
        return FileLeaseStore(folder).release(ids=[lease.id])

    with pytest.raises(UserError, match="only its holder"):
        as_account(MALLORY, tamper)
    assert [held.id for held in as_account(BOB, FileLeaseStore(folder).list)] == [lease.id]


@needs_root
def test_a_forged_lease_in_another_user_s_name_is_not_believed_and_refuses_its_device(folder):
    (real,) = as_account(ALICE, _take, folder, "tcp://10.0.0.7:5025")

    def forge():
        data = {"version": 2, "lease": {**real.to_json(), "id": "a" * 12, "identity": "tcp://10.0.0.8:5025"}}
        name = f"testbed-lease-{device_key('tcp://10.0.0.8:5025')}-{'a' * 12}.json"
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, json.dumps(data).encode())
        os.close(fd)
        return name

    name = as_account(MALLORY, forge)
    store = FileLeaseStore(folder)
    assert [lease.id for lease in store.list()] == [real.id]  # the forgery is not a lease of alice's
    assert [d.path.name for d in store.damaged] == [name]
    with pytest.raises(UserError, match=f"{name}.*names {ALICE} as its holder, but {MALLORY} owns it"):
        as_account(BOB, _take, folder, "tcp://10.0.0.8:5025")  # fails closed for the device it names


# --- the folder and its files -----------------------------------------------------------------------------------


@needs_root
def test_a_planted_symlink_is_refused_and_its_target_untouched(folder):
    as_account(ALICE, _take, folder, "tcp://10.0.0.9:5025")  # makes the folder
    victim = folder / "alice-secret"
    victim.write_text("alice's own")
    os.chown(victim, ALICE, ALICE)
    victim.chmod(0o600)
    name = f"testbed-lease-{device_key('tcp://10.0.0.10:5025')}-{'b' * 12}.json"

    def plant():
        os.symlink(victim, folder / name)

    as_account(MALLORY, plant)
    with pytest.raises(UserError, match=f"{name} cannot be opened as a lease file \\(a symbolic link\\)"):
        as_account(ALICE, _take, folder, "tcp://10.0.0.10:5025")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "alice's own"


def test_a_lease_folder_that_is_a_link_is_refused(folder):
    (folder / "elsewhere").mkdir(mode=0o1777)
    (folder / "leases").symlink_to(folder / "elsewhere")
    with pytest.raises(LeaseFolderError, match="a symbolic link"):
        FileLeaseStore(folder / "leases").list()


@needs_root
def test_a_lease_folder_another_user_owns_is_refused(folder):
    as_account(MALLORY, FileLeaseStore(folder / "leases").list)  # a TESTBED_LEASE_DIR mallory made first
    with pytest.raises(LeaseFolderError, match=f"belongs to {MALLORY}"):
        as_account(ALICE, FileLeaseStore(folder / "leases").list)


def test_a_damaged_lease_file_fails_closed_naming_it(folder):
    _take(folder, "tcp://10.0.0.11:5025")
    (path,) = folder.glob("testbed-lease-*.json")
    path.write_text('{"version": 2, "lease": {"id": ')  # as a disk error or a hand edit leaves it
    with pytest.raises(UserError, match=f"{path.name} not a lease"):
        _take(folder, "tcp://10.0.0.11:5025", "run")
    assert _take(folder, "tcp://10.0.0.12:5025")  # only the device it names is refused


def test_a_writer_killed_before_its_rename_leaves_the_lease_as_it_was(folder):
    (lease,) = _take(folder, "tcp://10.0.0.13:5025", "run")
    pid = os.fork()
    if pid == 0:  # a renewal killed between writing its new file and renaming it into place
        os.rename = lambda *a, **k: os._exit(9)
        FileLeaseStore(folder).renew([lease.id], 7200)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    (kept,) = FileLeaseStore(folder).list()
    assert kept.id == lease.id and abs(kept.until - lease.until) < 1  # neither lost nor half-renewed
    assert _take(folder, "tcp://10.0.0.14:5025")  # and the folder works on


def test_two_takers_at_once_never_both_get_the_device(folder):
    FileLeaseStore(folder).list()  # the folder made first

    def take(name: str, start: threading.Barrier, results: list) -> None:
        start.wait()
        try:
            results.append(FileLeaseStore(folder).acquire({name: "tcp://10.0.0.15:5025"}, me(name), "run", 60))
        except Exception as exc:  # e.g. the other taker's withdrawn file, unlinked while read, taken for damage
            results.append(exc)

    for _ in range(20):
        start, results = threading.Barrier(2), []
        threads = [threading.Thread(target=take, args=(n, start, results)) for n in ("r1", "r2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not [r for r in results if isinstance(r, Exception)], results  # each is granted or refused
        granted = [r for r in results if not isinstance(r, Refused)]
        assert len(granted) <= 1
        store = FileLeaseStore(folder)
        store.release(ids=[lease.id for lease in store.list()])


def test_a_lease_ends_by_the_boot_clock_within_a_boot_whatever_the_wall_clock_says(folder):
    (lease,) = _take(folder, "tcp://10.0.0.16:5025")
    (path,) = folder.glob("testbed-lease-*.json")
    data = json.loads(path.read_text())
    data["lease"]["until"] = time.time() - 3600  # as if the wall clock had jumped forward past its end
    data["clock"] = boot_clock(time.time() + 3600)  # the boot-time clock says it has an hour left
    path.write_text(json.dumps(data))
    (kept,) = FileLeaseStore(folder).list()
    assert kept.id == lease.id and kept.until > time.time() + 3000


@needs_root
def test_a_hand_written_lease_for_ten_years_lasts_no_longer_than_the_cap(folder):
    """A lease file its owner wrote by hand (a ten-year lease, by the wall clock and by the boot clock): believed as
    that account's lease, but ending LIFETIME_CAP_S after the file was written, as the longest `--for` would.
    """
    (lease,) = as_account(MALLORY, _take, folder, "tcp://10.0.0.17:5025")
    (path,) = folder.glob("testbed-lease-*.json")

    def rewrite():
        data = json.loads(path.read_text())
        data["lease"]["until"] = time.time() + 10 * 365 * 86400
        data["clock"] = boot_clock(time.time() + 10 * 365 * 86400)
        path.write_text(json.dumps(data))

    as_account(MALLORY, rewrite)
    (kept,) = FileLeaseStore(folder).list()
    assert kept.id == lease.id and kept.until == path.stat().st_ctime + LIFETIME_CAP_S


# --- a run whose lease lapsed stops --------------------------------------------------------------------------------


def test_a_lease_that_lapsed_while_the_holder_slept_stops_it_before_its_next_command(folder, monkeypatch):
    monkeypatch.setenv("TESTBED_LEASE_TTL_S", "0.3")
    store = FileLeaseStore(folder)
    with held(store, {"ocs1": "tcp://10.0.0.17:5025"}, me("r1")) as leases:
        leases.check()
        stopped_renewing = threading.Event()
        deadline = time.monotonic() + 10
        # The renewal thread cannot run while the process is stopped: do the same by not renewing.
        leases.renew_once = lambda: stopped_renewing.set()
        while time.monotonic() < deadline:  # the lease's life passes without a renewal
            try:
                leases.check()
            except LeaseLapsed as exc:
                assert "ocs1" in str(exc) and "another user may hold" in str(exc)
                break
            time.sleep(0.02)  # polling for a timeout to pass, with a deadline
        else:
            raise AssertionError("the lapsed lease still counted as held")


def test_a_lease_gone_from_the_store_is_lapsed_at_the_next_renewal(folder):
    store = FileLeaseStore(folder)
    (lease,) = store.acquire({"ocs1": "tcp://10.0.0.18:5025"}, me("r1"), "run", 60)
    leases = HeldLeases(store, [lease], 60)
    leases.check()
    store.release(ids=[lease.id])  # as if it had lapsed and been taken meanwhile
    leases.renew_once()
    with pytest.raises(LeaseLapsed, match="no longer held when renewed"):
        leases.check()


def test_a_lease_file_withdrawn_while_another_taker_reads_it_is_gone_not_damaged(folder, monkeypatch):
    """A taker that lost a race unlinks the file it wrote; another, reading that file at that moment, sees it with no
    link left. That file is gone: the device is free, not refused as damaged.
    """
    _take(folder, "tcp://10.0.0.17:5025")
    (path,) = folder.glob("testbed-lease-*.json")
    real_fstat = os.fstat

    def fstat_after_the_withdrawal(f):  # the holder unlinks its file between the reader's open and its fstat
        if stat.S_ISREG(real_fstat(f).st_mode):  # the lease file's (not the folder's)
            path.unlink(missing_ok=True)
        return real_fstat(f)

    reader = FileLeaseStore(folder)
    monkeypatch.setattr(os, "fstat", fstat_after_the_withdrawal)
    leases = reader.list()
    monkeypatch.undo()
    assert leases == [] and reader.damaged == []
    assert _take(folder, "tcp://10.0.0.17:5025")  # the device is free
