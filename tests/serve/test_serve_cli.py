"""`testbed plan`, `runs`, `report` and `lease list` with a real `testbed serve --emulate` answering, and with none:
what a user sees on the terminal either way. With a server: the plan is the server's (its Lab, its inventory) drawn
as the standalone plan is; the runs are those of the server's results folder and its queue; a report of a run of
that folder is written by the server where the user may not write; the leases the server holds name the run and
its user. With none: each says so (plan, runs) and does what it always did.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts import ALICE, as_account, needs_root
from served import BLOCKER, OCS_RECONFIG, SHORT, Served, ended, waiting

from testbed.serve.client import Client, ServerError
from testbed.serve.identity import SERVE_DIR_ENV


@pytest.fixture(scope="module")
def served(repo, serve_dir) -> Iterator[Served]:
    """A server whose results folder every account may read (a lab's, under /var/lib/testbed, is), with a lease
    folder of its own; and one run of the OCS reconfiguration made, to list and report.
    """
    leases = serve_dir.parent / "leases"
    leases.mkdir()
    saved = os.environ.get("TESTBED_LEASE_DIR")
    os.environ["TESTBED_LEASE_DIR"] = str(leases)  # the server's and the commands' (Served copies os.environ)
    try:
        server = Served(repo, serve_dir.parent / "results", serve_dir)
    finally:
        if saved is None:
            del os.environ["TESTBED_LEASE_DIR"]
        else:
            os.environ["TESTBED_LEASE_DIR"] = saved
    try:
        run = server.submit((repo / OCS_RECONFIG).read_text(), trials=2)  # a run with spans, tables, figures
        server.run_dir = Path(server.events_until(ended(run["id"]))[-1]["run"]["run_dir"])
        yield server
    finally:
        said = server.stop()
        assert server.proc.returncode == 0, said


def cli(repo: Path, env: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=cwd or repo, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def no_server(served, tmp_path) -> dict:
    """The environment of a user whose lab has no server: its socket folder holds none."""
    empty = tmp_path / "no-server"
    empty.mkdir()
    return served.env | {SERVE_DIR_ENV: str(empty)}


def test_plan_through_the_server_is_the_standalone_plan_and_says_where_it_was_made(repo, served, no_server):
    standalone = cli(repo, served.env, "plan", OCS_RECONFIG, "--trials", "2", "--standalone")
    assert standalone.returncode == 0, standalone.stderr
    assert standalone.stdout.startswith("ocs-reconfig on emulated-rack (playbooks/inventory/emulated-rack.yaml)")

    through = cli(repo, served.env, "plan", OCS_RECONFIG, "--trials", "2")
    assert through.returncode == 0, through.stderr
    assert through.stdout == f"via testbed serve at {served.socket}\n" + standalone.stdout

    alone = cli(repo, no_server, "plan", OCS_RECONFIG, "--trials", "2")
    assert alone.returncode == 0, alone.stderr
    said = "standalone: no testbed serve answers for emulated-rack.yaml (or its twin)\n"
    assert alone.stdout == said + standalone.stdout


def test_a_plan_the_server_refuses_is_a_clear_error_naming_the_user_s_file(repo, served, tmp_path):
    playbook = tmp_path / "mine.yaml"
    playbook.write_text("name: x\nsteps: 3\n")
    refused = cli(repo, served.env, "plan", str(playbook), "--inventory", "playbooks/inventory/emulated-rack.yaml")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and str(playbook) in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "testbed-serve-" not in refused.stderr

    other = tmp_path / "inventory" / "emulated-rack.yaml"  # the server's inventory's name, not its content
    other.parent.mkdir()
    other.write_text((repo / "playbooks/inventory/emulated-rack.yaml").read_text() + "\n# another lab\n")
    refused = cli(repo, served.env, "plan", OCS_RECONFIG, "--inventory", str(other))
    assert refused.returncode == 2
    assert "yours is not that file; run with --standalone" in refused.stderr, refused.stderr


def test_runs_lists_the_server_s_results_folder_and_its_queue(repo, served, no_server, tmp_path):
    blocker = served.submit(BLOCKER)
    served.events_until(waiting(blocker["id"]))
    queued = served.submit(SHORT, tags=["next"])
    try:
        listed = cli(repo, served.env, "runs", "--json", cwd=tmp_path)  # ./results here: none; the server's count
        assert listed.returncode == 0, listed.stderr
        assert listed.stderr == f"via testbed serve at {served.socket}: the runs of {served.results}\n"
        rows = json.loads(listed.stdout)
        assert served.run_dir.name in [r["folder"] for r in rows]
        queue_rows = [r for r in rows if r.get("queue")]
        last = queue_rows[-1]
        assert (last["queue"]["id"], last["status"], last["owner"], last["queue"]["position"], last["tags"]) == (
            queued["id"], "queued", "root", 1, ["next"]
        )  # fmt: skip
        blocker_dir = Path(served.client.run(blocker["id"])["run_dir"]).name
        as_blocker = [r for r in rows if r["folder"] == blocker_dir or _queue_id(r) == blocker["id"]]
        assert len(as_blocker) == 1 and as_blocker[0]["status"] == "running", as_blocker

        table = cli(repo, served.env, "runs", cwd=tmp_path)
        assert table.returncode == 0, table.stderr
        row = next(line for line in table.stdout.splitlines() if queued["id"] in line)
        assert [cell.strip() for cell in row.split("│")[1:4]] == [f"{queued['id']} (queue 1)", "queued", "root"]
        assert f"{len(rows) - len(queue_rows)} runs, {len(queue_rows)} in the server's queue" in table.stdout

        filtered = cli(repo, served.env, "runs", "--status", "ok", "--json", cwd=tmp_path)
        assert {r["status"] for r in json.loads(filtered.stdout)} == {"ok"}  # the queue's runs are not ok yet
    finally:
        served.client.cancel(queued["id"])
        served.client.cancel(blocker["id"])
        served.events_until(ended(blocker["id"]))

    alone = cli(repo, no_server, "runs", "--json", cwd=served.results.parent)  # ./results is that folder here
    assert alone.returncode == 0, alone.stderr
    assert alone.stderr == "standalone: no testbed serve answers; the runs of ./results\n"
    rows = json.loads(alone.stdout)
    assert served.run_dir.name in [r["folder"] for r in rows] and not any(r.get("queue") for r in rows)
    forced = cli(repo, served.env, "runs", "--standalone", "--json", cwd=served.results.parent)
    assert forced.stderr == "" and json.loads(forced.stdout) == rows


def _queue_id(row: dict) -> str | None:
    return row["queue"]["id"] if row.get("queue") else None


def _report_as_user(env: dict, *args: str) -> tuple[int, str, str]:
    """`testbed report ...` in this process, as the account it runs as -> (exit code, stdout, stderr)."""
    from testbed.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with _environ(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["report", *args])
    return code, out.getvalue(), err.getvalue()


@needs_root
def test_a_report_of_a_server_run_is_written_by_the_server_where_the_user_may_not_write(served, no_server, tmp_path):
    run_dir = served.run_dir  # the server's (root's), readable by all; alice may not write in it
    prefix = run_dir.name[:18]
    env = {SERVE_DIR_ENV: served.env[SERVE_DIR_ENV], "MPLCONFIGDIR": "/tmp"}
    # The account's process is a fork of this one, which may not reach the interpreter's files: what the command
    # imports is imported here first (a report of the run, its tables alone, as root).
    import testbed.results.html_report  # noqa: F401 - the command's, without a server

    assert _report_as_user(env, prefix, "--no-plots")[0] == 0
    for png in run_dir.glob("*.png"):
        png.unlink()

    code, out, err = as_account(ALICE, _report_as_user, env, prefix)
    assert code == 0, err
    assert err.splitlines()[0] == f"run {prefix}: {run_dir} (testbed serve at {served.socket})"
    assert "reconfig.total" in out  # the run's tables, as for any run
    drawn = [line.removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote ")]
    assert drawn and all(Path(p).parent == run_dir and Path(p).stat().st_uid == 0 for p in drawn)

    code, out, err = as_account(ALICE, _report_as_user, env, prefix, "--html")
    assert code == 0, err
    page = run_dir / "report.html"
    assert out.strip() == f"wrote {page} (by testbed serve at {served.socket})"
    assert page.stat().st_uid == 0 and "<html" in page.read_text()

    alone = {SERVE_DIR_ENV: no_server[SERVE_DIR_ENV], "MPLCONFIGDIR": "/tmp"}  # as without a server: refused
    # what the command imports without a server is imported here first (as root, the page written elsewhere)
    assert _report_as_user(alone, str(run_dir), "--html", str(tmp_path / "warm.html"))[0] == 0
    code, out, err = as_account(ALICE, _report_as_user, alone, str(run_dir), "--html")
    assert code == 2
    assert err.strip() == f"error: {run_dir}: owned by root: the report is not written into it; pass --html FILE"


def test_lease_list_adds_the_run_and_user_the_server_holds_its_leases_for(repo, served, no_server):
    from testbed.documents import load_inventory
    from testbed.leases import identities, lease_store
    from testbed.leases.table import Holder

    blocker = served.submit(BLOCKER)
    served.events_until(waiting(blocker["id"]))
    # The twin takes no lease: the lease a lab's server takes for its run is taken here in the server's process's
    # name, in the store the server reads (a real lab's Lab takes it so, docs/leases.md).
    inventory = load_inventory(repo / "playbooks/inventory/emulated-rack.yaml").model
    store_env = {"TESTBED_LEASE_DIR": served.env["TESTBED_LEASE_DIR"]}
    with _environ(store_env):
        store = lease_store()
        holder = Holder("root", socket.gethostname(), served.proc.pid, run="the-run-folder")
        (lease,) = store.acquire(identities(inventory, ["ocs1"]), holder, "run", 600)
    try:
        listed = cli(repo, served.env, "lease", "list")
        assert listed.returncode == 0, listed.stderr
        line = next(line for line in listed.stdout.splitlines() if lease.id in line)
        assert line.endswith(f"[testbed serve: run {blocker['id']} of root]"), listed.stdout
        assert listed.stdout.splitlines()[-1] == (
            f"testbed serve at {served.socket} (root@{socket.gethostname()} pid {served.proc.pid}): 1 lease(s), "
            f"run {blocker['id']} of root"
        )
        alone = cli(repo, no_server, "lease", "list")
        assert alone.returncode == 0, alone.stderr
        assert lease.id in alone.stdout and "testbed serve" not in alone.stdout  # the store's view, as ever
    finally:
        with _environ(store_env):
            lease_store().release(ids=[lease.id])
        served.client.cancel(blocker["id"])
        served.events_until(ended(blocker["id"]))


@contextlib.contextmanager
def _environ(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_every_route_is_in_the_openapi_document_and_bad_input_is_a_json_error(served):
    from testbed.serve.api import Service, make_app
    from testbed.serve.identity import Admins
    from testbed.serve.queue import RunQueue

    document = served.client.request("GET", "/openapi.json")
    described = {(path, method) for path, ops in document["paths"].items() for method in ops if method != "parameters"}
    app = make_app(Service(RunQueue(), Admins(), {}, prepare=None, stop_running=None))
    routes = {(r.resource.canonical, r.method.lower()) for r in app.router.routes() if r.method != "HEAD"}
    assert routes == described
    for path in ("/plan", "/catalog/runs", "/results/{run}", "/results/{run}/report", "/leases"):
        assert path in document["paths"]

    client: Client = served.client
    refusals = [
        (lambda: client.plan({"playbook": SHORT, "emulate": False}), "this server runs the emulated twin"),
        (lambda: client.request("POST", "/plan", {"playbook": 3}), "playbook: give the playbook's YAML text"),
        (lambda: client.catalog_runs({"since": "yesterday-ish"}), "yesterday-ish"),
        (lambda: client.request("GET", "/catalog/runs?colour=red"), "unknown filter colour"),
        (lambda: client.result("no-such-run"), "no run 'no-such-run'"),
        (lambda: client.request("POST", "/results/x/report", {"html": "yes"}), "html: give true or false"),
    ]
    for act, said in refusals:
        with pytest.raises(ServerError) as refused:
            act()
        assert refused.value.status == 400 and said in str(refused.value), str(refused.value)
