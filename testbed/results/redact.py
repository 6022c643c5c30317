"""Secrets never reach results or logs: anything that looks like a credential is masked."""

from __future__ import annotations

import functools
import re

# Keys whose values are secrets wherever they appear in recorded data.
SECRET_KEYS = re.compile(r"pass(word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key", re.IGNORECASE)
_WORDS = r"pass(?:word|wd|phrase)?|secret|token|api[_-]?key|private[_-]?key"
# Secrets inside text (device traffic, errors): TL1 ACT-USER passwords, `password=...` pairs, JSON and XML
# password fields, HTTP Authorization headers, credentials in URLs, IPMI -P arguments. A driver masks what it sends
# itself (the TL1 transport writes `ACT-USER::user:ctag::***;` in its audit); these catch what another does not.
SECRET_IN_TEXT = [
    # ACT-USER:[tid]:user:ctag::password; (the target identifier may be empty or not)
    (re.compile(r"(ACT-USER:[^:;]*:[^:;]*:[^:;]*::)([^;]*)", re.IGNORECASE), r"\1***"),
    # "Password": "..." (a JSON body, Redfish's session login among them)
    (re.compile(rf'("(?:[^"]*(?:{_WORDS})[^"]*)"\s*:\s*)"(?:[^"\\]|\\.)*"', re.IGNORECASE), r'\1"***"'),
    # <password>...</password>, with or without a namespace prefix (NETCONF's XML)
    (re.compile(rf"(<(?:[\w.-]+:)?(?:{_WORDS})\b[^>]*>)[^<]*", re.IGNORECASE), r"\1***"),
    # Authorization: Basic ..., Bearer ... (and Proxy-Authorization)
    (re.compile(r"((?:proxy-)?authorization\s*:\s*(?:[a-z][\w-]*\s+)?)\S+", re.IGNORECASE), r"\1***"),
    # scheme://user:password@host
    (re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)", re.IGNORECASE), r"\1***\3"),
    (re.compile(r"((?:password|passwd|secret|token)\s*[=:]\s*)(\S+)", re.IGNORECASE), r"\1***"),
    (re.compile(r"(\s-P\s+)(\S+)"), r"\1***"),
]


# Every pattern above needs one of these in the text (compared case-folded, as IGNORECASE matches). Device
# traffic rarely has any, and the recorder redacts every audit record: a 256-port switch's replies are
# kilobytes, and a scan per pattern of each would cost the coordinator more than the rest of a rail change.
_NEEDLES = ("act-user", "pass", "secret", "token", "api", "private", "authorization", "@")


def redact_text(text: str) -> str:
    if "-P" not in text:
        folded = text.casefold()
        if not any(needle in folded for needle in _NEEDLES):
            return text
    for pattern, repl in SECRET_IN_TEXT:
        text = pattern.sub(repl, text)
    return text


# A secret whose command was cut in two writes: the first ends where the secret begins.
_SECRET_FOLLOWS = re.compile(
    r"(?:ACT-USER:[^:;]*:[^:;]*:[^:;]*::[^;]*|(?:password|passwd|secret|token)\s*[=:]\s*)$", re.IGNORECASE
)
_SECRET_END = re.compile(r"[;\s]")


class StreamRedactor:
    """Redaction of one byte stream cut into records (a device's writes, one audit record each): a secret whose
    command was split over two writes (`ACT-USER::admin:1::` then `s3cret;`) is masked in the second as well.
    """

    def __init__(self) -> None:
        self._open: dict[tuple, bool] = {}  # stream -> a secret is being written

    def redact(self, stream: tuple, text: str) -> str:
        head = ""
        if self._open.get(stream):
            end = _SECRET_END.search(text)
            cut = end.start() if end else len(text)
            head, text = ("***" if cut else ""), text[cut:]
            self._open[stream] = end is None  # the secret goes on into the next write
            if end is None:
                return head
        self._open[stream] = bool(_SECRET_FOLLOWS.search(text))
        return head + redact_text(text)


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
