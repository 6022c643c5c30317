"""The web page's leases, as a person keeps the page open in a real headless browser: a reservation taken with
`testbed lease acquire ... --for SHORT` appears with its holder, kind, times and note, and goes away by itself when
its time has passed, without a reload.

The server serves the twin of playbooks/inventory/lab-example.yaml, a lab's inventory: leases are taken on a lab's
devices (`testbed lease acquire` refuses an emulated-only inventory such as the default emulated-rack, whose runs
take none), and the page shows the store `testbed lease list` reads, this machine's lease folder.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess
import sys
import urllib.request

from served import Served
from test_web import Page

from testbed.leases.file_store import FileLeaseStore
from testbed.serve.leases_view import read_leases

LAB = "playbooks/inventory/lab-example.yaml"
# Long enough that the page (told within a second of each read of the store) surely shows it before it lapses.
RESERVATION = "10s"

LEASE_ROWS = """() => [...document.querySelectorAll("#leases tbody tr")].map(r => ({
  id: r.dataset.lease, kind: r.dataset.kind, cells: [...r.cells].map(c => c.textContent),
  notes: document.getElementById("lease-notes").textContent}))"""
NOTES = """document.getElementById("lease-notes").textContent"""


def test_a_reservation_appears_on_the_page_and_lapses_by_itself(repo, tmp_path, serve_dir):
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o700)  # this account's lease folder: the server and `testbed lease` read the same
    env = {"TESTBED_LEASE_DIR": str(leases)}
    server = Served(repo, tmp_path / "results", serve_dir.parent / "leases", web=True, options=["--inventory", LAB],
                    env=env)  # fmt: skip
    page = None
    try:
        page = Page(server.web_url, tmp_path / "chromium-profile")
        page.rows_when(f"rows => {NOTES}.startsWith('no leases; from this machine')", LEASE_ROWS)

        taken = subprocess.run(
            [sys.executable, "-m", "testbed", "lease", "acquire", "ocs1", "--for", RESERVATION,
             "--note", "tonight's sweep", "--inventory", LAB],
            cwd=repo, env=os.environ | env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert taken.returncode == 0, taken.stderr
        lease_id = re.search(r"id ([0-9a-f]{12})", taken.stdout).group(1)
        pid = re.search(r"pid (\d+)", taken.stdout).group(1)

        rows = page.rows_when(f"rows => rows.some(r => r.id === '{lease_id}')", LEASE_ROWS)
        (row,) = rows
        device, identity, holder, kind, since, until, note = row["cells"]
        user = pwd.getpwuid(os.geteuid()).pw_name
        assert (device, kind, note) == ("ocs1", "reservation", "tonight's sweep")
        assert identity == "tl1://ocs1.lab.example.org:3082"  # the switch itself, as `testbed lease list` says
        assert holder == f"{user}@{socket.gethostname()} pid {pid}"
        assert since != until and str(leases) in row["notes"]

        # Nobody releases it: its time passes, and the page, open all along, shows the device free again.
        rows = page.rows_when(f"rows => rows.length === 0 && {NOTES}.startsWith('no leases')", LEASE_ROWS)
        assert rows == []
        with urllib.request.urlopen(server.web_url + "leases", timeout=30) as answer:
            assert json.load(answer)["leases"] == []
        with urllib.request.urlopen(server.web_url + "openapi.json", timeout=30) as answer:
            assert {"/leases", "/leases/events"} <= set(json.load(answer)["paths"])
    finally:
        if page is not None:
            page.close()
        assert server.stop() and server.proc.returncode == 0


def test_the_leases_read_says_why_a_folder_cannot_be_trusted(tmp_path):
    open_folder = tmp_path / "everyones"
    open_folder.mkdir()
    open_folder.chmod(0o777)  # anyone may write, no sticky bit: anyone could remove anyone's lease
    state = read_leases(FileLeaseStore(open_folder))
    assert state["leases"] == [] and str(open_folder) in state["error"]


def test_a_lease_file_that_cannot_be_believed_is_shown_with_its_device_refused(tmp_path):
    folder = tmp_path / "leases"
    folder.mkdir(mode=0o700)
    planted = folder / f"testbed-lease-{'0' * 20}-{'1' * 12}.json"
    planted.symlink_to(tmp_path / "elsewhere.json")  # a link under a lease's name: never followed
    state = read_leases(FileLeaseStore(folder))
    assert state["error"] is None and state["leases"] == []
    assert [d["path"] for d in state["damaged"]] == [str(planted)]
    assert "link" in state["damaged"][0]["why"]
