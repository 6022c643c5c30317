"""Secrets never reach results or logs: anything that looks like a credential is masked."""

from __future__ import annotations

import functools
import re

# Keys whose values are secrets wherever they appear in recorded data.
SECRET_KEYS = re.compile(r"pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key", re.IGNORECASE)
# Secrets inside device traffic: TL1 ACT-USER passwords, `password=...` pairs, IPMI -P arguments.
SECRET_IN_TEXT = [
    # ACT-USER:[tid]:user:ctag::password; (the target identifier may be empty or not)
    (re.compile(r"(ACT-USER:[^:;]*:[^:;]*:[^:;]*::)([^;]*)", re.IGNORECASE), r"\1***"),
    (re.compile(r"((?:password|passwd|secret|token)\s*[=:]\s*)(\S+)", re.IGNORECASE), r"\1***"),
    (re.compile(r"(\s-P\s+)(\S+)"), r"\1***"),
]


# Every pattern above needs one of these in the text (compared case-folded, as IGNORECASE matches). Device
# traffic rarely has any, and the recorder redacts every audit record: a 256-port switch's replies are
# kilobytes, and three regex scans of each cost the coordinator more than the rest of a rail change.
_NEEDLES = ("act-user", "passw", "secret", "token")


def redact_text(text: str) -> str:
    if "-P" not in text:
        folded = text.casefold()
        if not any(needle in folded for needle in _NEEDLES):
            return text
    for pattern, repl in SECRET_IN_TEXT:
        text = pattern.sub(repl, text)
    return text


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    # Records repeat a few keys thousands of times (a GPU's fields, an audit record's): one search per key.
    # A key ending in _env (password_env) holds the name of the variable, not the secret: masking it would
    # leave run.json's inventory unable to say where `testbed heal` finds the password.
    return SECRET_KEYS.search(key) is not None and not key.lower().endswith("_env")


def redact(value):
    if isinstance(value, dict):
        return {k: ("***" if isinstance(k, str) and v and _secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
