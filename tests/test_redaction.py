"""Secrets never reach a run's files: the recorder masks them in device traffic and in event data."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from drivers.audit import AuditRecord
from testbed.results.recorder import Recorder
from testbed.results.redact import SECRET_IN_TEXT, redact, redact_text


def test_secrets_in_device_traffic_are_masked_in_the_audit_log(tmp_path):
    recorder = Recorder(tmp_path, "run")
    lines = [
        "ACT-USER::admin:12::hunter2;",
        "ACT-USER:POLATIS-1:admin:13::hunter2;",  # with a target identifier
        "login user=lab password=hunter2 mode=1",
        "ipmitool -I lanplus -H bmc1 -U admin -P hunter2 chassis power off",
        ":OXC:SWIT:CONN:ADD (@1),(@17)",
    ]
    recorder.audit([AuditRecord("dev", "addr", "tx", line, i, 0.0) for i, line in enumerate(lines)])
    env = {"user": "lab", "password": "hunter2", "api_key": "k-123"}  # a job's environment, say
    recorder.emit("invoke", "gpu.start_job", device="dev", data={"command": ["train"], "env": env})
    recorder.close()
    audit = (tmp_path / "audit.jsonl").read_text()
    events = (tmp_path / "events.jsonl").read_text()
    assert "hunter2" not in audit and "k-123" not in events
    masked = [json.loads(line)["data"] for line in audit.splitlines()]
    assert masked[0] == "ACT-USER::admin:12::***;"
    assert masked[1] == "ACT-USER:POLATIS-1:admin:13::***;"
    assert masked[4] == ":OXC:SWIT:CONN:ADD (@1),(@17)"  # ordinary traffic is untouched


def test_the_secrets_other_protocols_carry_are_masked_too(tmp_path):
    recorder = Recorder(tmp_path, "run")
    lines = [
        ("tx", 'POST /redfish/v1/SessionService/Sessions {"UserName": "admin", "Password": "hunter2"}'),
        ("tx", "GET https://admin:hunter2@bmc1.lab/redfish/v1/Systems"),
        ("tx", "GET /redfish/v1 HTTP/1.1\r\nAuthorization: Basic aHVudGVyMjpodW50ZXIy\r\nX-Auth-Token: hunter2"),
        ("tx", "<rpc><edit-config><password>hunter2</password><nc:password xmlns:nc='x'>hunter2</nc:password>"),
        # one command cut in two writes: the password is the start of the second
        ("tx", "ACT-USER::admin:14::hun"),
        ("tx", "ter2;RTRV-HDR:::15;"),
        ("tx", "login password="),
        ("tx", "hunter2 now"),
    ]
    recorder.audit([AuditRecord("dev", "addr", d, line, i, 0.0) for i, (d, line) in enumerate(lines)])
    recorder.close()
    audit = (tmp_path / "audit.jsonl").read_text()
    assert "hunter2" not in audit and "aHVudGVy" not in audit and "hun" not in audit.replace("hunter", "")
    masked = [json.loads(line)["data"] for line in audit.splitlines()]
    assert masked[1] == "GET https://admin:***@bmc1.lab/redfish/v1/Systems"
    assert masked[5] == "***;RTRV-HDR:::15;"  # the rest of the stream is as it was
    assert masked[7] == "*** now"


def test_a_split_secret_is_followed_per_stream():
    from testbed.results.redact import StreamRedactor

    streams = StreamRedactor()
    assert streams.redact(("ocs1", "tx"), "ACT-USER::admin:1::") == "ACT-USER::admin:1::***"
    assert streams.redact(("ocs1", "rx"), "IP 1") == "IP 1"  # the switch's answers are another stream
    assert streams.redact(("ocs2", "tx"), "s3cret;") == "s3cret;"  # and so is another device's
    assert streams.redact(("ocs1", "tx"), "s3c") == "***"
    assert streams.redact(("ocs1", "tx"), "ret;RTRV-HDR:::2;") == "***;RTRV-HDR:::2;"
    assert streams.redact(("ocs1", "tx"), "RTRV-HDR:::3;") == "RTRV-HDR:::3;"


def test_redact_keeps_structure_and_non_secret_values():
    value = {"user": "lab", "token": "t", "nested": [{"passphrase": "p", "port": 22}]}
    assert redact(value) == {"user": "lab", "token": "***", "nested": [{"passphrase": "***", "port": 22}]}


# Pieces of secrets in odd cases and spellings (ſ and K fold to s and k, as IGNORECASE matches them)
_PIECES = [
    "password",
    "PassWD",
    "paſſword",
    "secret",
    "TOKEN",
    "toKen",
    "to\u212aen",
    "ACT-USER::a:1::",
    "act-user::b:2::",
    " -P ",
    "-P",
    "=",
    ":",
    ";",
    " ",
    "x",
    "1",
    "\t",
    "(@1,2)",
    "-1.00,",
    "Authorization: ",
    "Bearer ",
    "https://u:",
    "@h/",
    '"Password"',
    '"',
    "<password>",
    "</password>",
    "<nc:Secret>",
    "api_key",
    "Private-Key",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))
def test_the_shortcut_for_text_without_secrets_masks_exactly_what_the_patterns_do(text):
    expected = text
    for pattern, repl in SECRET_IN_TEXT:
        expected = pattern.sub(repl, expected)
    assert redact_text(text) == expected
