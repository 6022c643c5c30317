"""The server's queue on disk (testbed.serve.queue_file), as a lab relies on it beyond the kill test of
test_serve.py: it is its server's alone (owner-only, one server at a time), and a file planted or damaged in its
place is never read through nor stops the next server from starting.
"""

from __future__ import annotations

import os
import stat

import pytest
from accounts import ALICE, needs_root

from testbed.contracts.errors import UserError
from testbed.serve.queue_file import QueueFile

RECORD = {
    "id": "0a1b2c3d",
    "uid": ALICE,
    "user": str(ALICE),
    "playbook_file": "/home/alice/mine.yaml",
    "playbook_text": "name: mine\n",
    "options": {"trials": 1, "seed": None, "tags": [], "note": None, "params": {}, "yes": False},
    "submitted": 1.5,
    "started": None,
    "run_dir": None,
}


def test_the_saved_queue_is_read_back_in_order_and_is_its_owner_s_alone(tmp_path):
    kept = QueueFile(tmp_path / "results", "lab")
    second = RECORD | {"id": "99999999"}
    kept.save(None, [second, RECORD])
    assert stat.S_IMODE(kept.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.path.parent.stat().st_mode) == 0o700
    assert [p.name for p in kept.path.parent.iterdir() if p.name.endswith(".tmp")] == []  # renamed into place
    kept.close()

    again = QueueFile(tmp_path / "results", "lab")
    assert again.load() == (None, [second, RECORD], None)
    again.close()


def test_a_second_server_for_the_same_queue_is_refused_while_the_first_holds_it(tmp_path):
    first = QueueFile(tmp_path / "results", "lab")
    with pytest.raises(UserError) as refused:
        QueueFile(tmp_path / "results", "lab")
    assert str(refused.value) == (
        f"another testbed serve keeps its queue in {first.path}: stop it first, or give another --results"
    )
    first.close()  # as a killed server's lock goes with its process
    QueueFile(tmp_path / "results", "lab").close()


def test_a_link_planted_in_the_queue_s_place_is_set_aside_unread_and_the_server_starts_empty(tmp_path):
    kept = QueueFile(tmp_path / "results", "lab")
    secret = tmp_path / "secret.json"
    secret.write_text('{"version": 1, "running": null, "queued": []}')
    kept.path.symlink_to(secret)
    running, queued, warning = kept.load()
    assert (running, queued) == (None, [])
    aside = next(p for p in kept.path.parent.iterdir() if p.name.startswith("lab.queue.json.unread-"))
    assert warning.startswith("the saved queue was not read (") and warning.endswith(f"; set aside as {aside}")
    assert "symbolic link" in warning
    assert aside.is_symlink() and secret.read_text().startswith('{"version"')  # the link moved, its target not
    kept.save(None, [RECORD])  # and the queue is kept again, in a file of its own
    assert not kept.path.is_symlink() and kept.load() == (None, [RECORD], None)
    kept.close()


@pytest.mark.parametrize(
    "text",
    ['{"version": 1, "running": null, "queued": [{"id": 3}]}', "not json", '{"version": 7, "queued": []}'],
    ids=["a-run-not-ours", "not-json", "another-version"],
)
def test_a_damaged_queue_is_set_aside_naming_why(tmp_path, text):
    kept = QueueFile(tmp_path / "results", "lab")
    kept.path.write_text(text)
    running, queued, warning = kept.load()
    assert (running, queued) == (None, []) and warning.startswith(f"the saved queue was not read ({kept.path}")
    assert not kept.path.exists()
    kept.close()


@needs_root
def test_a_queue_folder_of_another_account_is_refused(tmp_path):
    folder = tmp_path / "results" / ".serve"
    folder.mkdir(parents=True)
    os.chown(folder, ALICE, ALICE)  # alice could have put a queue of her runs, as root's, in it
    with pytest.raises(UserError) as refused:
        QueueFile(tmp_path / "results", "lab")
    assert str(refused.value) == f"{folder}: owned by {ALICE}, not by this account; remove it or give --results"
