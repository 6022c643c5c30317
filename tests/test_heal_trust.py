"""`testbed heal` acts on a lab from a run folder, often as root: it believes a folder only if the invoking user owns
it and no one else can write it, and it drives the lab as the user's own inventory file describes it, never as
run.json does (docs/run-folders.md). The folders below are forged as an attacker would forge them; the
accounts are real (created by the test as root, as the lease tests do).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from accounts import ALICE, BOB, MALLORY, as_account, needs_root, shared_folder
from rich.console import Console

from testbed.contracts.errors import EXIT_EXPERIMENT_FAILED, UserError
from testbed.documents import load_inventory
from testbed.events import Op
from testbed.ops.heal import heal_run
from testbed.results.folder import inventory_source
from testbed.results.recorder import Recorder

SECRET = "the-healers-tl1-password"

INVENTORY = """\
name: {name}
devices:
  ocs1:
    kind: ocs
    driver: polatis-tl1
    transport: {{type: tl1, host: 127.0.0.1, port: {port}, user: admin, password_env: {env}, timeout_ms: 2000}}
    size: 8
"""


def listener() -> socket.socket:
    """A TCP listener heal may connect to; accept() afterwards tells, without waiting, whether it did (the kernel
    completes a connection into the backlog before heal's connect returns).
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def lab_run(run_dir: Path, inventory: dict, **info) -> Path:
    """A run folder of a lab run whose runner died after finding ocs1's circuits: heal would restore them."""
    run_dir.mkdir(mode=0o755)
    dead_runner = {"pid": os.getpid(), "start_ticks": -1, "hostname": socket.gethostname()}  # not this process
    record = {"run": run_dir.name, "status": "running", "emulate": False, "runner": dead_runner}
    record |= {"playbook": {"name": "forged"}, "trials": 1, "inventory": inventory, **info}
    (run_dir / "run.json").write_text(json.dumps(record))
    recorder = Recorder(run_dir, run_dir.name)
    circuits = {"circuits": {"ocs1": {"1": 5}}, "managed": {"ocs1": [1, 5]}}
    recorder.emit("mark", Op.FABRIC_INITIAL, data=circuits)
    recorder.close()
    return run_dir


def inventory_of(tmp_path: Path, name: str, port: int, env: str = "HEALER_SECRET") -> tuple[Path, dict]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(INVENTORY.format(name=name, port=port, env=env))
    return path, load_inventory(path).model.model_dump(mode="json")


def heal(run_dir: Path, inventory_file: str | None = None) -> int:
    return heal_run(run_dir, Console(file=open(os.devnull, "w"), width=200), inventory_file)  # noqa: SIM115


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- the folder must be the invoking user's own -------------------------------------------------------------


@needs_root
def test_heal_refuses_another_accounts_folder_as_root_and_as_another_user(tmp_path):
    """Alice's run folder in a shared results folder: neither root on call nor Bob heals it; each is told why and
    what to do, and nothing in the folder changes.
    """
    shared = shared_folder()
    attacker = listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    run_dir = as_account(ALICE, lambda: lab_run(shared / "alices-run", forged))
    before = files_of(run_dir)

    with pytest.raises(UserError) as refused:
        heal(run_dir)
    assert f"the folder is owned by uid {ALICE}, not by you (root)" in str(refused.value)
    assert "chown -R root" in str(refused.value) and "copy it to a folder of your own" in str(refused.value)

    with pytest.raises(UserError) as refused_bob:
        as_account(BOB, heal, run_dir)
    assert f"owned by uid {ALICE}, not by you (uid {BOB})" in str(refused_bob.value)
    assert files_of(run_dir) == before and not connected(attacker)


def test_heal_refuses_its_own_folder_when_others_can_write_it(tmp_path):
    attacker = listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    run_dir = lab_run(tmp_path / "run", forged)
    run_dir.chmod(0o775)  # a umask of 002: the group may write it
    with pytest.raises(UserError, match="the folder is writable by its group"):
        heal(run_dir)
    run_dir.chmod(0o755)
    (run_dir / "events.jsonl").chmod(0o646)
    with pytest.raises(UserError, match="events.jsonl is writable by every account"):
        heal(run_dir)
    (run_dir / "events.jsonl").chmod(0o644)
    results = tmp_path / "results"
    results.mkdir(mode=0o777)
    results.chmod(0o777)  # every account may rename what is in it (no sticky bit): the folder could be swapped
    moved = run_dir.rename(results / "run")
    with pytest.raises(UserError, match=r"parent folder is writable by its group and every account \(and not sticky"):
        heal(moved)
    assert not connected(attacker)


@needs_root
def test_heal_refuses_its_own_folder_with_a_file_another_account_planted(tmp_path):
    """A file another account owns in the folder (planted while it was writable, or a hard link to theirs)."""
    attacker = listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    run_dir = lab_run(tmp_path / "run", forged)
    os.chown(run_dir / "run.json", MALLORY, MALLORY)
    with pytest.raises(UserError, match=f"run.json is owned by uid {MALLORY}"):
        heal(run_dir)
    assert not connected(attacker)


# --- the lab as the user's inventory describes it --------------------------------------------------------------


def test_heal_never_drives_a_lab_described_by_run_json(tmp_path, monkeypatch):
    """A forged run.json names a TL1 switch at an address the attacker listens on, with password_env naming a
    variable of the healer's environment: heal connects to nothing and sends nothing, and says why.
    """
    monkeypatch.setenv("HEALER_SECRET", SECRET)
    attacker = listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    run_dir = lab_run(tmp_path / "run", forged)
    with pytest.raises(UserError, match="records no inventory file .* pass the inventory the run used"):
        heal(run_dir)
    assert not connected(attacker)


def test_heal_refuses_an_inventory_whose_digest_is_not_the_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALER_SECRET", SECRET)
    attacker, mine = listener(), listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    my_file, _ = inventory_of(tmp_path, "mine", mine.getsockname()[1])
    source = {"path": str(my_file), "sha256": "0" * 64}  # the forger cannot know what the user's file holds
    run_dir = lab_run(tmp_path / "run", forged, inventory_source=source)
    with pytest.raises(UserError, match="is not the inventory the run used: its sha256 is"):
        heal(run_dir)
    with pytest.raises(UserError, match="is not the inventory the run used"):
        heal(run_dir, inventory_file=str(my_file))  # given by hand: still the run's own, or refused
    assert not connected(attacker) and not connected(mine)


@needs_root
def test_heal_refuses_a_recorded_inventory_another_account_could_have_written(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALER_SECRET", SECRET)
    attacker = listener()
    theirs, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    os.chown(theirs, MALLORY, MALLORY)
    run_dir = lab_run(tmp_path / "run", forged, inventory_source=inventory_source(str(theirs)))
    with pytest.raises(UserError, match=f"owned by uid {MALLORY}, so it may not be the lab as you describe it"):
        heal(run_dir)
    assert not connected(attacker)


def test_heal_drives_the_switch_of_the_users_inventory_not_the_one_run_json_names(tmp_path, monkeypatch):
    """run.json's inventory names the attacker; the run's own inventory file (recorded, digest matching) names the
    user's switch: heal logs in there, with the user's secret, and never reaches the attacker.
    """
    monkeypatch.setenv("HEALER_SECRET", SECRET)
    attacker, mine = listener(), listener()
    _, forged = inventory_of(tmp_path, "forged", attacker.getsockname()[1])
    my_file, _ = inventory_of(tmp_path, "mine", mine.getsockname()[1])
    run_dir = lab_run(tmp_path / "run", forged, inventory_source=inventory_source(str(my_file)))
    # The user's switch here accepts and never answers: heal fails on it after its timeout, and says so.
    assert heal(run_dir) == EXIT_EXPERIMENT_FAILED
    assert not connected(attacker)
    conn, _ = mine.accept()
    conn.setblocking(True)
    with conn:
        sent = conn.recv(4096)
    assert b"ACT-USER::admin:" in sent and SECRET.encode() in sent  # the secret went to the user's own switch
    healed = json.loads((run_dir / "run.json").read_text())["healed"]
    assert not healed["ok"] and "ocs1" in healed["problems"][0]


def test_a_run_records_its_inventory_files_path_and_digest(tmp_path):
    path, _ = inventory_of(tmp_path, "mine", 4000)
    assert inventory_source(str(path)) == {"path": str(path.resolve()), "sha256": _sha256(path)}
    assert inventory_source(str(tmp_path / "no-such.yaml")) == {"path": None, "sha256": None}


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
