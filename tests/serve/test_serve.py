"""`testbed serve --emulate` as a lab runs it: a real server process on a real Unix socket, real clients (the `testbed`
command, and testbed.serve.client from other accounts). What a user relies on: a run submitted through the CLI
completes into a results folder `testbed check` passes; runs are made one after another in the queue's order;
one account cannot cancel another's run and its owner can; a server killed outright leaves what `testbed heal`
restores, and a new server starts on its socket.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts import ALICE, BOB, as_account, needs_root
from served import BLOCKER, OCS_RECONFIG, SHORT, Served, ended, started, waiting

from testbed.catalog.annotations import read_annotations
from testbed.serve.client import Client, ServerError


@pytest.fixture(scope="module")
def served(repo, tmp_path_factory, serve_dir) -> Iterator[Served]:
    server = Served(repo, tmp_path_factory.mktemp("served") / "results", serve_dir)
    yield server
    said = server.stop()
    assert server.proc.returncode == 0, said
    assert "closing the lab" in said and not server.socket.exists()


def cli(repo: Path, served: Served, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args], cwd=repo, env=served.env, capture_output=True, text=True, timeout=300
    )


def test_a_run_through_the_cli_completes_into_a_folder_check_passes(repo, served):
    proc = cli(
        repo, served, "run", OCS_RECONFIG, "--emulate", "--trials", "2",
        "--tag", "served-run", "--note", "through the server", "--param", "fibre_m=20",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"via testbed serve at {served.socket}"
    assert any(line.startswith("trials 2/2 (ok") for line in lines)
    assert "reconfig.total" in proc.stdout  # the summary table, as a standalone run prints it
    run_dir = Path(lines[-1].removeprefix("results: "))
    assert run_dir.parent == served.results
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and info["playbook_file"] == str(repo / OCS_RECONFIG)

    checked = cli(repo, served, "check", str(run_dir))
    assert checked.returncode == 0, checked.stdout
    listed = cli(repo, served, "runs", "--results", str(served.results), "--json")
    assert run_dir.name in {r["run_id"] for r in json.loads(listed.stdout)}  # the catalog entry, as standalone
    # what --tag, --note and --param gave it is kept with it, as a standalone run keeps them, and selects it
    tagged = cli(repo, served, "runs", "--results", str(served.results), "--tag", "served-run", "--param", "fibre_m=20",
                 "--json")  # fmt: skip
    assert [r["run_id"] for r in json.loads(tagged.stdout)] == [run_dir.name], tagged.stdout + tagged.stderr
    tags, notes = read_annotations(run_dir)
    assert [t["name"] for t in tags] == ["served-run"] and [n["text"] for n in notes] == ["through the server"]

    run_id = lines[1].split()[1]  # "run ID queued"
    queue = cli(repo, served, "queue", "--emulate")
    assert queue.returncode == 0
    assert any(row.split("│")[1:4] == [f" {run_id} ", " root ", " ok     "] for row in queue.stdout.splitlines())


def test_runs_are_made_one_after_another_in_the_queue_s_order(served):
    first = served.submit(BLOCKER)
    served.events_until(waiting(first["id"]))
    second = served.submit(BLOCKER, trials=1)
    third = served.submit(BLOCKER)
    assert [r["id"] for r in served.client.runs() if r["status"] == "queued"] == [second["id"], third["id"]]

    moved = served.client.move(third["id"], 1)  # root is one of the lab's admins: it moves anyone's run
    assert moved["position"] == 1
    served.client.cancel(second["id"])
    served.client.cancel(first["id"])  # the running one stops as on Ctrl-C; the third is next
    events = served.events_until(started(third["id"]))
    served.client.cancel(third["id"])
    events += served.events_until(ended(third["id"]), since=events[-1]["seq"])

    order = [(e["type"], e["run"]["id"]) for e in events if e["type"] in ("run.started", "run.ended")]
    ids = {first["id"]: "first", second["id"]: "second", third["id"]: "third"}
    order = [(kind, ids[i]) for kind, i in order if i in ids]
    assert order == [
        ("run.started", "first"),
        ("run.ended", "second"),  # cancelled while queued: it never starts
        ("run.ended", "first"),
        ("run.started", "third"),
        ("run.ended", "third"),
    ]
    first_end = next(e["run"] for e in events if ended(first["id"])(e))
    assert first_end["status"] == "aborted" and first_end["error"] == "cancelled by root"
    assert served.client.run(second["id"])["status"] == "cancelled"
    run_json = json.loads((Path(first_end["run_dir"]) / "run.json").read_text())
    assert run_json["status"] == "aborted" and run_json["error"] == "cancelled by root"


def _submit_blocker(socket: Path, playbook: str = BLOCKER, **options) -> dict:
    return Client(socket).submit({"playbook": playbook, "playbook_file": "alice.yaml", "emulate": True} | options)


def _try(socket: Path, act: str, run_id: str):
    """An act on a run from this account -> ("ok", its answer) or ("refused", HTTP status, message)."""
    client = Client(socket)
    try:
        return ("ok", client.cancel(run_id) if act == "cancel" else client.move(run_id, 1))
    except ServerError as exc:
        return ("refused", exc.status, str(exc))


@needs_root
def test_one_account_cannot_cancel_another_s_run_and_its_owner_can(served):
    blocker = served.submit(BLOCKER)  # root's, running: alice's run waits behind it
    served.events_until(waiting(blocker["id"]))
    alices = as_account(ALICE, _submit_blocker, served.socket)
    assert alices["user"] == str(ALICE)  # the kernel's word for who submitted it (no passwd entry: the uid)

    for act in ("cancel", "move"):
        refused = as_account(BOB, _try, served.socket, act, alices["id"])
        assert refused[:2] == ("refused", 403), refused
        assert refused[2] == (
            f"run {alices['id']} is {ALICE}'s: only {ALICE} or the lab's admins (root) may {act} it; you are {BOB}"
        )
    refused = as_account(BOB, _try, served.socket, "cancel", blocker["id"])
    assert refused[:2] == ("refused", 403)
    assert served.client.run(alices["id"])["status"] == "queued"  # untouched

    cancelled = as_account(ALICE, _try, served.socket, "cancel", alices["id"])
    assert cancelled[0] == "ok" and cancelled[1]["outcome"] == "cancelled"
    assert served.client.run(alices["id"])["error"] == f"cancelled by {ALICE} before it started"

    # what alice's run is given is recorded as hers, not as the account the server runs as
    annotated = as_account(ALICE, _submit_blocker, served.socket, SHORT, tags=["alices"], note="mine")
    served.client.cancel(blocker["id"])
    final = served.events_until(ended(annotated["id"]))[-1]["run"]
    assert final["status"] == "ok", final
    tags, notes = read_annotations(Path(final["run_dir"]))
    assert [(t["name"], t["user"]) for t in tags] == [("alices", str(ALICE))]
    assert [(n["text"], n["user"]) for n in notes] == [("mine", str(ALICE))]


def test_a_second_server_for_the_lab_is_refused_and_the_first_keeps_its_socket(repo, served):
    second = cli(repo, served, "serve", "--emulate", "--results", str(served.results))
    assert second.returncode == 2
    said = f"error: another testbed serve answers on {served.socket}: stop it first, or give --socket"
    assert second.stderr.strip() == said
    assert served.client.info()["pid"] == served.proc.pid


def test_a_bad_playbook_is_refused_at_submit_naming_the_client_s_file(served):
    with pytest.raises(ServerError) as refused:
        served.client.submit({"playbook": "name: x\nsteps: 3\n", "playbook_file": "/home/u/mine.yaml"})
    assert refused.value.status == 400
    assert "/home/u/mine.yaml" in str(refused.value) and "testbed-serve-" not in str(refused.value)
    with pytest.raises(ServerError) as refused:
        served.client.submit({"playbook": BLOCKER, "emulate": False})
    assert refused.value.status == 400 and "runs the emulated twin" in str(refused.value)


@pytest.mark.timeout(600)  # two servers' cold starts, four runs and a heal: past the default bound on a loaded CI
def test_a_server_killed_outright_leaves_what_heal_restores_and_the_next_one_makes_its_queued_runs(
    repo, tmp_path, serve_dir
):
    from testbed.engine.ray_session import leftovers

    killed_dir = serve_dir.parent / "killed"  # a socket of its own: the module's server serves on beside it
    server = Served(repo, tmp_path / "results", killed_dir)
    try:
        run = server.submit(BLOCKER)
        events = server.events_until(waiting(run["id"]))
        run_dir = Path(events[-1]["run"]["run_dir"])
        second = server.submit(SHORT, tags=["after-the-kill"])
        third = server.submit(SHORT)
        server.client.move(third["id"], 1)  # the queue's order, not the order submitted, is what is kept
        playbook = tmp_path / "short.yaml"
        playbook.write_text(SHORT)
        follower = subprocess.Popen(  # a user's `testbed run`, queued behind them, following its run
            [sys.executable, "-m", "testbed", "run", str(playbook), "--emulate"],
            cwd=repo, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        queued = server.events_until(lambda e: e["type"] == "run.queued" and e["run"]["playbook"] == str(playbook))
        cli_run = queued[-1]["run"]

        saved = server.results / ".serve" / f"{server.socket.name.removesuffix('.sock')}.queue.json"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
        kept = json.loads(saved.read_text())
        assert kept["running"]["id"] == run["id"] and kept["running"]["run_dir"] == str(run_dir)
        assert [r["id"] for r in kept["queued"]] == [third["id"], second["id"], cli_run["id"]]
    except BaseException:  # a failure before the kill: the server stopped, not left running past the test
        server.stop()
        raise

    os.kill(server.proc.pid, signal.SIGKILL)  # the server's own process: what it started is heal's to end
    server.proc.communicate(timeout=60)
    assert server.socket.is_socket()  # left behind, nobody answering
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 2, out + err
    assert err.strip().endswith(
        f"went away before run {cli_run['id']} ended: it was queued, and is kept: the next server for the lab makes "
        "it (testbed queue lists it)"
    ), err

    info = json.loads((run_dir / "run.json").read_text())
    healed = subprocess.run(
        [sys.executable, "-m", "testbed", "heal", str(run_dir)], cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert healed.returncode == 0, healed.stdout + healed.stderr
    assert f"twin (pid {info['twin_pid']}) is gone" in healed.stdout
    assert leftovers(info["ray"]["session_dir"]) == []
    checked = subprocess.run(
        [sys.executable, "-m", "testbed", "check", str(run_dir)], cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    again = Served(repo, tmp_path / "results", killed_dir)  # the stale socket is replaced, the queue restored
    try:
        assert again.socket == server.socket
        said = "".join(again.said)
        lost = f"the server was killed while it ran this run: testbed heal {run_dir} restores what it left"
        assert f"run {run['id']} (root): {lost}" in said
        order = [third["id"], second["id"], cli_run["id"]]
        assert f"restored 3 queued run(s), in order: {', '.join(f'{i} (root)' for i in order)}" in said
        events = again.events_until(ended(cli_run["id"]))
        assert [e["run"]["id"] for e in events if e["type"] == "run.started"] == order
        ends = {e["run"]["id"]: e["run"] for e in events if e["type"] == "run.ended"}
        assert (ends[run["id"]]["status"], ends[run["id"]]["error"]) == ("aborted", lost)
        assert [ends[i]["status"] for i in order] == ["ok", "ok", "ok"], ends
        tagged = subprocess.run(  # what it was submitted with came back with it
            [sys.executable, "-m", "testbed", "runs", "--results", str(again.results), "--tag", "after-the-kill"]
            + ["--json"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert [r["folder"] for r in json.loads(tagged.stdout)] == [Path(ends[second["id"]]["run_dir"]).name]
        assert json.loads(saved.read_text()) == {"version": 1, "running": None, "queued": []}
    finally:
        assert again.stop() and again.proc.returncode == 0


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopping_the_server_stops_its_run_as_ctrl_c_does_and_cancels_the_queue(repo, tmp_path, serve_dir, stop_signal):
    server = Served(repo, tmp_path / "results", serve_dir.parent / f"stopped-{stop_signal.name}")
    running = server.submit(BLOCKER)
    events = server.events_until(waiting(running["id"]))
    queued = server.submit(BLOCKER)
    run_dir = Path(events[-1]["run"]["run_dir"])

    server.proc.send_signal(stop_signal)
    said = server.proc.communicate(timeout=120)[0]
    assert server.proc.returncode == 0, said
    assert f"cancelled {queued['id']} (root): the server was stopped ({stop_signal.name})" in said
    assert "closing the lab" in said and not server.socket.exists()
    info = json.loads((run_dir / "run.json").read_text())
    why = "terminated (SIGTERM)" if stop_signal == signal.SIGTERM else "stopped with the server (SIGINT)"
    assert (info["status"], info["error"]) == ("aborted", why)
    ops = [json.loads(line)["op"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert ops[-3:] == ["wait", "fabric.final", "run.aborted"]  # stopped in its wait, the fabric read back, as Ctrl-C
    checked = subprocess.run(
        [sys.executable, "-m", "testbed", "check", str(run_dir)], cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_testbed_run_with_no_server_runs_standalone_and_says_so(repo, tmp_path):
    from testbed.serve.identity import SERVE_DIR_ENV

    nobody = tmp_path / "no-server"  # where a server would be: nothing answers there
    nobody.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "testbed", "run", OCS_RECONFIG, "--emulate", "--trials", "1"]
        + ["--results", str(tmp_path / "results")],
        cwd=repo, env=os.environ | {SERVE_DIR_ENV: str(nobody)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "standalone: no testbed serve answers for the twin of emulated-rack.yaml"
    run_dir = Path(lines[-1].removeprefix("results: "))
    assert run_dir.parent == tmp_path / "results"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
