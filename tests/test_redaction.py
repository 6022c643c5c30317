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
]


@given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))
def test_the_shortcut_for_text_without_secrets_masks_exactly_what_the_patterns_do(text):
    expected = text
    for pattern, repl in SECRET_IN_TEXT:
        expected = pattern.sub(repl, expected)
    assert redact_text(text) == expected
