"""The webhook (testbed.serve.webhook) against real local receivers: a call is POSTed with its JSON body from a
thread, a receiver's failure (500), silence (a receiver that hangs) or untrusted certificate is logged with the URL
redacted and what to change, and nothing waits on it but the bounded close. Then `testbed serve --webhook`: a run's
end is told, and a receiver that hangs or fails neither blocks nor fails a run.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import pwd
import sys
from pathlib import Path

import pytest
from receivers import Receiver
from served import SHORT, Served, ended

from testbed.cli.main import main
from testbed.contracts.errors import EXIT_BAD_INPUT, UserError
from testbed.serve.api import OPENAPI
from testbed.serve.webhook import Webhook, check_url, redact

SECRET_URL_PARTS = ("s3cret", "abc123")


def _certs():
    """tests/redfish/certs.py: a CA and the certificate it issued for 127.0.0.1, or one that signed itself."""
    path = Path(__file__).resolve().parent.parent / "redfish" / "certs.py"
    spec = importlib.util.spec_from_file_location("redfish_certs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def said() -> list[str]:
    return []


def test_a_call_is_posted_with_its_body_and_the_url_s_login_as_basic_authorization(said):
    receiver = Receiver()
    try:
        webhook = Webhook(receiver.url("/hooks/ci?token=abc123", userinfo="ci:s3cret@"), said.append)
        webhook.post("run 1 ended", {"event": "run.ended", "id": "1", "status": "ok"})
        webhook.post("run 2 ended", lambda: {"event": "run.ended", "id": "2", "status": "failed"})  # made in its thread
        assert webhook.close() == 0
        first, second = receiver.next_call(), receiver.next_call()
    finally:
        receiver.close()
    assert first["body"] == {"event": "run.ended", "id": "1", "status": "ok"} and second["body"]["id"] == "2"
    assert first["path"] == "/hooks/ci?token=abc123" and first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["Authorization"] == "Basic " + base64.b64encode(b"ci:s3cret").decode()
    assert said == []


def test_a_receiver_that_answers_500_is_logged_with_the_url_redacted(said):
    receiver = Receiver(500)
    try:
        webhook = Webhook(receiver.url("/hook?token=abc123", userinfo="ci:s3cret@"), said.append)
        webhook.post("gate FAIL", {"event": "gate.failed"})
        assert webhook.close() == 0
        assert receiver.next_call()["body"] == {"event": "gate.failed"}
    finally:
        receiver.close()
    (line,) = said
    assert line.startswith(f"webhook http://***@127.0.0.1:{receiver.port}/hook?token=***: gate FAIL not delivered")
    assert "answered 500" in line and "change the URL given to --webhook" in line
    assert not any(secret in line for secret in SECRET_URL_PARTS)


def test_a_receiver_that_hangs_holds_no_caller_and_is_logged_after_the_call_s_bound(said):
    receiver = Receiver(hang=True)
    try:
        webhook = Webhook(receiver.url(), said.append, timeout_s=0.5)
        webhook.post("run 1 ended", {"event": "run.ended"})  # returns at once: the call is the thread's
        assert receiver.next_call()["body"] == {"event": "run.ended"}  # under way, and held by the receiver
        assert said == []
        assert webhook.close(wait_s=60) == 0  # the call gave up at its bound, well within the close's
    finally:
        receiver.close()
    (line,) = said
    assert "run 1 ended not delivered: no answer within 0.5 s" in line and "change --webhook" in line


def test_https_is_verified_against_the_machine_s_trust(tmp_path, said, monkeypatch):
    certs = _certs()
    untrusted, trusted = certs.self_signed_leaf(tmp_path), certs.ca_issued(tmp_path)
    receiver = Receiver(cert=untrusted.cert, key=untrusted.key)
    try:
        webhook = Webhook(receiver.url(), said.append)
        webhook.post("run 1 ended", {"event": "run.ended"})
        assert webhook.close() == 0
    finally:
        receiver.close()
    (line,) = said
    assert "its certificate is not trusted" in line and "SSL_CERT_FILE" in line
    assert receiver.calls.empty()  # nothing was sent to a receiver that could not prove who it is

    said.clear()
    monkeypatch.setenv("SSL_CERT_FILE", str(trusted.ca))  # the lab's CA, trusted: the same call goes through
    receiver = Receiver(cert=trusted.chain, key=trusted.key)
    try:
        webhook = Webhook(receiver.url(), said.append)
        webhook.post("run 1 ended", {"event": "run.ended"})
        assert webhook.close() == 0
        assert receiver.next_call()["body"] == {"event": "run.ended"}
    finally:
        receiver.close()
    assert said == []


def test_a_redirect_is_not_followed_and_says_where_it_pointed(said):
    target = Receiver()
    redirect = Receiver(307)
    try:
        webhook = Webhook(redirect.url(), said.append)
        webhook.post("run 1 ended", {"event": "run.ended"})
        assert webhook.close() == 0
    finally:
        redirect.close()
        target.close()
    (line,) = said
    assert "answered 307" in line and "not followed" in line
    assert target.calls.empty()


def test_urls_print_without_their_secrets_and_bad_ones_are_clear_errors():
    assert redact("https://ci:s3cret@hooks.lab:8443/x?token=abc123&team=ops#frag") == (
        "https://***@hooks.lab:8443/x?token=***&team=***#***"
    )
    assert redact("https://hooks.lab/x") == "https://hooks.lab/x"
    for bad in ("ftp://hooks.lab/x", "hooks.lab/x", "https://", "http://hooks.lab:port/x"):
        with pytest.raises(UserError, match="--webhook"):
            check_url(bad)
    with pytest.raises(UserError) as refused:
        check_url("ftp://ci:s3cret@hooks.lab/x?token=abc123")
    assert not any(secret in str(refused.value) for secret in SECRET_URL_PARTS)


def test_serve_refuses_a_webhook_that_is_not_a_url_before_it_starts(capsys):
    assert main(["serve", "--emulate", "--webhook", "ftp://ci:s3cret@hooks.lab/x"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "give an http:// or https:// URL" in err and "s3cret" not in err


def test_the_api_document_describes_the_webhook():
    body = OPENAPI["webhooks"]["runEnded"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"id", "user", "playbook", "status", "run_dir", "error", "figures"} <= set(body["properties"])


def test_serve_tells_each_run_s_end_and_a_failing_receiver_fails_no_run(repo, tmp_path, serve_dir):
    receiver = Receiver()
    url = receiver.url("/hooks/run?token=abc123", userinfo="ci:s3cret@")
    server = Served(repo, tmp_path / "results", serve_dir.parent / "hook", options=["--webhook", url])
    out = ""
    try:
        run = server.submit(SHORT)
        server.events_until(ended(run["id"]))
        call = receiver.next_call()
        body = call["body"]
        assert body["event"] == "run.ended" and body["id"] == run["id"] and body["status"] == "ok"
        assert body["user"] == pwd.getpwuid(os.geteuid()).pw_name  # the account that submitted it
        assert body["playbook"] == "blocker.yaml" and body["error"] is None
        assert Path(body["run_dir"]).parent == tmp_path / "results"
        assert body["figures"]["trials"] == {"planned": 1, "ok": 1, "failed": 0}
        assert body["server"]["emulate"] is True
        assert call["path"] == "/hooks/run?token=abc123"

        receiver.answer = 500  # the receiver breaks: the next run still runs, and ends ok
        second = server.submit(SHORT)
        events = server.events_until(ended(second["id"]))
        assert events[-1]["run"]["status"] == "ok"
        assert receiver.next_call()["body"]["id"] == second["id"]
    finally:
        out = server.stop()
        receiver.close()
    assert server.proc.returncode == 0
    logged = [line for line in out.splitlines() if line.startswith("webhook ")]
    assert logged == [
        f"webhook http://***@127.0.0.1:{receiver.port}/hooks/run?token=***: run {second['id']} ended not "
        "delivered: answered 500 Internal Server Error: the receiver refused or failed the call; see its log, or "
        "change the URL given to --webhook"
    ]
    assert not any(secret in out for secret in SECRET_URL_PARTS)


def test_serve_runs_on_while_the_receiver_hangs(repo, tmp_path, serve_dir):
    receiver = Receiver(hang=True)
    server = Served(repo, tmp_path / "results", serve_dir.parent / "hang", options=["--webhook", receiver.url()])
    out = ""
    try:
        first = server.submit(SHORT)
        server.events_until(ended(first["id"]))
        assert receiver.next_call()["body"]["id"] == first["id"]  # held by the receiver from now on
        second = server.submit(SHORT)  # runs, and ends, while the first call hangs
        events = server.events_until(ended(second["id"]))
        assert events[-1]["run"]["status"] == "ok"
    finally:
        out = server.stop()  # waits for the calls as long as one call's bound, no longer
        receiver.close()
    assert server.proc.returncode == 0
    assert f"run {first['id']} ended not delivered: no answer within 10 s" in out
