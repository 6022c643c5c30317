"""`testbed serve --remote` as a lab runs it: a real server process with a TLS listener, a certificate signed by a CA
the test makes (openssl, as docs/serve.md makes the lab's), tokens made by `testbed token new`, and real clients
(the `testbed` command, testbed.serve.client.RemoteClient, and http.client for the raw answers). What a user relies
on: a token's user submits and cancels over TLS; a missing or wrong token gets 401 and nothing else; one user's
token cannot cancel another's run; a client refuses a server whose certificate does not verify; a tokens file
others may read is refused; a token added or removed counts from the next request; the token is written nowhere.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pki import Pki, make_ca, make_pki
from served import BLOCKER, OCS_RECONFIG, Served, ended, waiting

from testbed.contracts.errors import UserError
from testbed.serve.client import RemoteClient, ServerError

ALICE, BOB, CAROL = "12001", "12002", "12003"  # users named by uid: accounts with no passwd entry, as in accounts.py
REMOTE_SAYS = "remote API (TLS, tokens) at "


def run_testbed(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "testbed", *args],
        cwd=repo, env=env or os.environ.copy(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def new_token(repo: Path, tokens: Path, user: str) -> str:
    proc = run_testbed(repo, "token", "new", user, "--tokens", str(tokens))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("secrets") / "tokens"


@pytest.fixture(scope="module")
def tokens(repo, tokens_file) -> dict[str, str]:
    return {user: new_token(repo, tokens_file, user) for user in (ALICE, BOB)}


@pytest.fixture(scope="module")
def remote(repo, tmp_path_factory, serve_dir, pki, tokens_file, tokens) -> Iterator[Served]:
    options = ("--remote", "127.0.0.1:0", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
               "--tokens", str(tokens_file))  # fmt: skip
    server = Served(repo, tmp_path_factory.mktemp("remote") / "results", serve_dir, options=options)
    said = [line for line in server.said if line.startswith(REMOTE_SAYS)]
    assert said, server.said
    server.url = said[0].removeprefix(REMOTE_SAYS).strip().rstrip("/")
    yield server
    if server.proc.poll() is None:
        server.stop()


def client(remote: Served, pki: Pki, token: str) -> RemoteClient:
    return RemoteClient(remote.url, token, ca=pki.ca, timeout=120)


def raw(remote: Served, pki: Pki, method: str, path: str, headers: dict) -> tuple[int, bytes]:
    """The server's answer as it is sent, read by the standard library's HTTPS client."""
    host, port = remote.url.removeprefix("https://").rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=pki.ca), timeout=60)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_the_listener_speaks_tls_1_2_and_1_3(remote, pki, version):
    context = ssl.create_default_context(cafile=pki.ca)
    context.minimum_version = context.maximum_version = version
    host, port = remote.url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        with context.wrap_socket(sock, server_hostname=host) as tls:
            assert tls.version() == version.name.replace("_", ".")  # TLSv1_2 is said TLSv1.2


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")  # the old versions, asked on purpose
def test_the_listener_refuses_tls_1_1(remote, pki):
    context = ssl.create_default_context(cafile=pki.ca)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client would speak TLS 1.1: the server is what refuses it
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    host, port = remote.url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(sock, server_hostname=host)


def test_a_user_submits_and_cancels_over_tls_with_a_token(repo, remote, pki, tokens):
    alice = client(remote, pki, tokens[ALICE])
    assert alice.info()["you"] == ALICE
    queued = alice.submit({"playbook": BLOCKER, "playbook_file": "blocker.yaml", "emulate": True})
    assert queued["user"] == ALICE and queued["uid"] == int(ALICE)
    remote.events_until(waiting(queued["id"]))

    env = os.environ | {"TESTBED_TOKEN": tokens[ALICE]}
    server = ("--server", remote.url, "--ca", str(pki.ca))
    cancelled = run_testbed(repo, "queue", "cancel", queued["id"], *server, env=env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert "stopping" in cancelled.stdout
    final = remote.events_until(ended(queued["id"]))[-1]["run"]
    assert final["status"] == "aborted" and final["error"] == f"cancelled by {ALICE}"

    listed = run_testbed(repo, "queue", *server, env=env)
    assert listed.returncode == 0, listed.stderr
    assert any(queued["id"] in row and ALICE in row and "aborted" in row for row in listed.stdout.splitlines())


def test_testbed_run_through_a_remote_server_completes_as_its_token_s_user(repo, remote, pki, tokens):
    env = os.environ | {"TESTBED_SERVER": remote.url, "TESTBED_TOKEN": tokens[BOB]}
    proc = run_testbed(repo, "run", OCS_RECONFIG, "--emulate", "--trials", "1", "--ca", str(pki.ca), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"via testbed serve at {remote.url}"
    run_dir = Path(lines[-1].removeprefix("results: "))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    run_id = lines[1].split()[1]  # "run ID queued"
    assert remote.client.run(run_id)["user"] == BOB


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic MTIwMDE6eA=="}, {"Authorization": "Bearer"}],
    ids=["missing", "wrong", "not-bearer", "empty"],
)
@pytest.mark.parametrize("method, path", [("GET", "/runs"), ("GET", "/openapi.json"), ("POST", "/runs")])
def test_a_missing_or_wrong_token_is_401_and_nothing_else(remote, pki, headers, method, path):
    status, body = raw(remote, pki, method, path, headers)
    assert (status, json.loads(body)) == (401, {"error": "unauthorized"})


def test_a_wrong_token_is_told_to_the_user_without_the_token(remote, pki, tokens):
    wrong = tokens[ALICE][::-1]
    with pytest.raises(ServerError) as refused:
        client(remote, pki, wrong).runs()
    assert refused.value.status == 401 and "refused the token" in str(refused.value)
    assert wrong not in str(refused.value) and wrong not in repr(client(remote, pki, wrong))


def test_another_user_s_token_cannot_cancel_a_run(remote, pki, tokens):
    alice, bob = client(remote, pki, tokens[ALICE]), client(remote, pki, tokens[BOB])
    queued = alice.submit({"playbook": BLOCKER, "playbook_file": "blocker.yaml", "emulate": True})
    with pytest.raises(ServerError) as refused:
        bob.cancel(queued["id"])
    assert refused.value.status == 403 and f"run {queued['id']} is {ALICE}'s" in str(refused.value)
    assert alice.run(queued["id"])["status"] in ("queued", "running")
    assert alice.cancel(queued["id"])["outcome"] in ("cancelled", "stopping")
    remote.events_until(ended(queued["id"]))


def test_a_token_cannot_have_the_server_read_a_file(remote, pki, tokens, tokens_file):
    with pytest.raises(ServerError) as refused:
        client(remote, pki, tokens[ALICE]).submit({"path": str(tokens_file), "emulate": True})
    assert refused.value.status == 400 and "locally" in str(refused.value)


def test_a_client_refuses_a_server_whose_certificate_does_not_verify(repo, remote, pki, tokens, tmp_path):
    stranger_ca, _ = make_ca(tmp_path / "stranger", "another CA")
    for ca in (None, stranger_ca):  # the system's CAs, then a CA that did not sign it
        with pytest.raises(UserError, match="its certificate does not verify") as refused:
            RemoteClient(remote.url, tokens[ALICE], ca=ca).runs()
        assert tokens[ALICE] not in str(refused.value)
    env = os.environ | {"TESTBED_TOKEN": tokens[ALICE]}
    proc = run_testbed(repo, "queue", "--server", remote.url, "--ca", str(stranger_ca), env=env)
    assert proc.returncode == 2 and "its certificate does not verify" in proc.stderr
    assert "Traceback" not in proc.stderr and tokens[ALICE] not in proc.stdout + proc.stderr


def test_the_token_file_of_a_user_is_used_only_when_only_they_may_read_it(repo, remote, pki, tokens, tmp_path):
    path = tmp_path / ".config" / "testbed" / "token"
    path.parent.mkdir(parents=True)
    path.write_text(tokens[BOB] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "TESTBED_TOKEN"} | {"HOME": str(tmp_path)}
    server = ("--server", remote.url, "--ca", str(pki.ca))
    refused = "others may read or write it (mode 0644); chmod 600 it"
    for mode, returncode, said in ((0o644, 2, refused), (0o600, 0, "testbed serve at")):
        path.chmod(mode)
        proc = run_testbed(repo, "queue", *server, env=env)
        assert proc.returncode == returncode and said in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_token_added_or_removed_counts_from_the_next_request(repo, remote, pki, tokens_file):
    carol_token = new_token(repo, tokens_file, CAROL)
    carol = client(remote, pki, carol_token)
    assert carol.info()["you"] == CAROL  # no restart, no signal
    removed = run_testbed(repo, "token", "remove", CAROL, "--tokens", str(tokens_file))
    assert removed.returncode == 0, removed.stderr
    with pytest.raises(ServerError) as refused:
        carol.info()
    assert refused.value.status == 401


def test_token_new_prints_the_token_once_and_stores_only_its_digest(repo, tmp_path):
    path = tmp_path / "tokens"
    token = new_token(repo, path, ALICE)
    stored = path.read_text()
    assert token not in stored and stored.startswith(f"{ALICE}: sha256:")
    assert path.stat().st_mode & 0o777 == 0o600
    again = new_token(repo, path, ALICE)  # a new token replaces the user's old one
    assert again != token and path.read_text().count(f"{ALICE}:") == 1


REFUSED_FILES = [
    (0o644, None, "others may read or write it (mode 0644); chmod 600"),
    (0o620, None, "others may read or write it (mode 0620)"),
    (0o600, int(ALICE), f"owned by uid {ALICE}, not by this account"),
]


@pytest.mark.parametrize("mode, owner, said", REFUSED_FILES, ids=["others-read", "group-writes", "another-owner"])
def test_a_tokens_file_others_may_read_or_own_is_refused(repo, pki, tmp_path, mode, owner, said):
    path = tmp_path / "tokens"
    new_token(repo, path, ALICE)
    path.chmod(mode)
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("giving the file to another account needs root (CI runs as root)")
        os.chown(path, owner, owner)
    proc = run_testbed(repo, "serve", "--emulate", "--results", str(tmp_path / "results"), "--remote", "127.0.0.1:0",
                   "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tokens", str(path))  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_a_tokens_file_given_through_a_link_is_refused(repo, pki, tmp_path):
    """The file checked is the file read: a link (which its folder's writer could point elsewhere) is not followed."""
    real = tmp_path / "tokens"
    new_token(repo, real, ALICE)
    link = tmp_path / "tokens-link"
    link.symlink_to(real)
    proc = run_testbed(repo, "serve", "--emulate", "--results", str(tmp_path / "results"), "--remote", "127.0.0.1:0",
                   "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tokens", str(link))  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = f"--tokens {link}: a symbolic link (to {real}); a secret is read only from the file itself"
    assert said in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_the_token_is_nowhere_in_the_server_s_output_run_folders_or_queue_file(remote, pki, tokens):
    alice = client(remote, pki, tokens[ALICE])
    blocker = alice.submit({"playbook": BLOCKER, "playbook_file": "blocker.yaml", "emulate": True, "tags": ["t"]})
    remote.events_until(waiting(blocker["id"]))
    behind = alice.submit({"playbook": BLOCKER, "playbook_file": "blocker.yaml", "emulate": True})
    queue_files = list((remote.results / ".serve").glob("*.queue.json"))
    assert queue_files and behind["id"] in queue_files[0].read_text()  # the queue on disk, with the run queued
    written = [queue_files[0].read_text()]
    os.kill(remote.proc.pid, signal.SIGHUP)  # systemctl reload: the tokens file read again, the server kept
    alice.cancel(behind["id"])
    alice.cancel(blocker["id"])
    remote.events_until(ended(blocker["id"]))
    said = remote.stop()
    assert remote.proc.returncode == 0 and "closing the lab" in said, said
    written += [p.read_text(errors="replace") for p in remote.results.rglob("*") if p.is_file()]
    for token in tokens.values():
        assert token not in said
        assert not [text for text in written if token in text]
