"""The fabric service's wire protocol: line-delimited JSON over TCP, one request a line, one answer a line.

A connection starts with `hello` (the run's token and the rank); then any number of `setup`, `prepare` and
`release` of a named configuration, each with an id of the rank's choosing that its answer carries back.
Every line the server reads gets exactly one answer line, in order.

    -> {"op": "hello", "token": "...", "rank": 3}
    <- {"id": null, "ok": true, "t_received_ns": ..., "t_answered_ns": ...}
    -> {"op": "setup", "config": "ring", "id": "3-1", "t_job_ns": 1718000000000000000}
    <- {"id": "3-1", "ok": true, "t_received_ns": ..., "t_answered_ns": ...}
    -> {"op": "setup", "config": "torus", "id": "3-2", "t_job_ns": ...}
    <- {"id": "3-2", "ok": false, "kind": "refused", "error": "configuration 'torus' is not one ...", ...}

`parse_request` and `parse_answer` are the only way in: they take any bytes and return a typed, frozen
dataclass or raise `ProtocolError`, never anything else (tests/fabric_service/test_protocol_fuzz.py).
The parser is strict (unknown fields, duplicate keys, NaN, booleans for numbers are refused), so a typo in a
rank's request is an answer naming it, not a silently ignored field.

Standard library only, so that a rank importing the client pays for json and nothing more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LINE = 64 * 1024  # bytes of one line, its newline not counted
MAX_NAME = 256  # characters of a configuration's name, a token, an id
ENCODING = "utf-8"
# Where a rank finds the service: its address (host:port, [v6]:port) and the run's token, in the environment.
ENV_ADDRESS = "TESTBED_FABRIC_SERVICE"
ENV_TOKEN = "TESTBED_FABRIC_TOKEN"  # noqa: S105 - the variable's name, not a secret

# Why an answer is not ok (the `kind` of an error answer).
REFUSED = "refused"  # the configuration is not allowed, or the handler refused it
UNAUTHORISED = "unauthorised"  # no hello first, or the wrong token; the server closes the connection
INVALID = "invalid"  # the line is not a request of this protocol
FAILED = "failed"  # the handler failed (a bug or a device error, not a decision)
ERROR_KINDS = (REFUSED, UNAUTHORISED, INVALID, FAILED)


class ProtocolError(ValueError):
    """A line that is not a message of this protocol. `id` is the request's id when it could be read."""

    def __init__(self, message: str, id: str | int | None = None) -> None:
        super().__init__(message)
        self.id = id


@dataclass(frozen=True)
class Hello:
    token: str
    rank: int
    op: str = "hello"

    def __repr__(self) -> str:  # the token never reaches a log
        return f"Hello(rank={self.rank})"


@dataclass(frozen=True)
class ConfigRequest:
    """setup, prepare or release of one configuration. `rank` is not on the wire: the server fills it in from the
    connection's hello before the handler sees the request, with the time it read the line.
    """

    op: str
    config: str
    id: str | int
    t_job_ns: int | None = None  # the rank's clock when it sent the request (time.time_ns on its host)
    rank: int | None = None
    t_received_ns: int | None = None  # not on the wire either: when the server read the line (monotonic)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"op": self.op, "config": self.config, "id": self.id}
        if self.t_job_ns is not None:
            wire["t_job_ns"] = self.t_job_ns
        return wire


@dataclass(frozen=True)
class Setup(ConfigRequest):
    """Set the fabric to the configuration now (the rank waits on the answer at a phase boundary)."""


@dataclass(frozen=True)
class Prepare(ConfigRequest):
    """The configuration will be wanted soon: anything that can be done ahead may be."""


@dataclass(frozen=True)
class Release(ConfigRequest):
    """The rank no longer needs the configuration."""


Request = Hello | Setup | Prepare | Release
CONFIG_OPS: dict[str, type[Setup | Prepare | Release]] = {"setup": Setup, "prepare": Prepare, "release": Release}


@dataclass(frozen=True)
class Answer:
    id: str | int | None
    ok: bool
    t_received_ns: int | None = None  # the server's monotonic clock when the line was read
    t_answered_ns: int | None = None  # ... and when the answer was sent
    error: str | None = None
    kind: str | None = None  # one of ERROR_KINDS when not ok

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "ok": self.ok}
        if self.t_received_ns is not None:
            wire["t_received_ns"] = self.t_received_ns
        if self.t_answered_ns is not None:
            wire["t_answered_ns"] = self.t_answered_ns
        if not self.ok:
            wire["error"] = self.error or ""
            wire["kind"] = self.kind or INVALID
        return wire


# -- the fields' rules --------------------------------------------------------------------------------------------

_REQUIRED = {"hello": ("op", "token", "rank"), "setup": ("op", "config", "id", "t_job_ns")}
_REQUIRED["prepare"] = _REQUIRED["release"] = ("op", "config", "id")
_ALLOWED = {"hello": {"op", "token", "rank"}} | {op: {"op", "config", "id", "t_job_ns"} for op in CONFIG_OPS}
_ANSWER_FIELDS = {"id", "ok", "t_received_ns", "t_answered_ns", "error", "kind"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _name(obj: dict[str, Any], key: str, what: str, id: str | int | None = None) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise ProtocolError(f"{key!r} must be a string ({what}), not {_type(value)}", id)
    if not value or len(value) > MAX_NAME:
        raise ProtocolError(f"{key!r} must be 1 to {MAX_NAME} characters long, not {len(value)}", id)
    return value


def _nonnegative(obj: dict[str, Any], key: str, id: str | int | None = None) -> int:
    value = obj[key]
    if not _is_int(value) or value < 0:
        raise ProtocolError(f"{key!r} must be a non-negative integer, not {_shown(value)}", id)
    return value


def _request_id(value: Any) -> str | int:
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME:
        return value
    if _is_int(value) and -(2**63) <= value < 2**63:
        return value
    raise ProtocolError(f"'id' must be a string of 1 to {MAX_NAME} characters or a 64-bit integer, not {_shown(value)}")


def _type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else _type(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ProtocolError(f"the key {key!r} appears twice")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise ProtocolError(f"{name} is not a JSON number this protocol accepts")


def _load_object(line: bytes | str) -> dict[str, Any]:
    """One line -> the JSON object it holds, or ProtocolError."""
    if isinstance(line, str):
        try:
            line = line.encode(ENCODING)
        except UnicodeEncodeError as e:  # a lone surrogate
            raise ProtocolError(f"the line is not encodable as {ENCODING}: {e.reason}") from None
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    if len(line) > MAX_LINE:
        raise ProtocolError(f"the line is {len(line)} bytes long; at most {MAX_LINE} are accepted")
    if b"\n" in line:
        raise ProtocolError("one message a line: the line holds a newline")
    try:
        text = line.decode(ENCODING)
    except UnicodeDecodeError as e:
        raise ProtocolError(f"the line is not {ENCODING}: {e.reason} at byte {e.start}") from None
    if not text.strip():
        raise ProtocolError("the line is empty")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("the line's JSON is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise ProtocolError(f"the line is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message is a JSON object, not {_type(obj)}")
    return obj


def parse_request(line: bytes | str) -> Request:
    """One line a rank sent -> its typed request, or ProtocolError saying what is wrong with it."""
    obj = _load_object(line)
    rid: str | int | None = None
    if "id" in obj:
        try:
            rid = _request_id(obj["id"])
        except ProtocolError:
            rid = None
    op = obj.get("op")
    if not isinstance(op, str):
        raise ProtocolError(f"'op' must be one of hello, {', '.join(CONFIG_OPS)}" if "op" in obj else "no 'op'", rid)
    if op not in _ALLOWED:
        raise ProtocolError(f"unknown op {_shown(op)} (ops: hello, {', '.join(CONFIG_OPS)})", rid)
    missing = [key for key in _REQUIRED[op] if key not in obj]
    if missing:
        raise ProtocolError(f"{op}: missing {', '.join(repr(k) for k in missing)}", rid)
    unknown = sorted(set(obj) - _ALLOWED[op])
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise ProtocolError(f"{op}: unknown field{'s' if len(unknown) > 1 else ''} {shown}", rid)
    if op == "hello":
        token = obj["token"]
        if not isinstance(token, str) or not 0 < len(token) <= MAX_NAME:
            raise ProtocolError(f"'token' must be a string of 1 to {MAX_NAME} characters")
        return Hello(token=token, rank=_nonnegative(obj, "rank"))
    request_id = _request_id(obj["id"])
    config = _name(obj, "config", "the configuration's name", request_id)
    t_job_ns = _nonnegative(obj, "t_job_ns", request_id) if "t_job_ns" in obj else None
    return CONFIG_OPS[op](op=op, config=config, id=request_id, t_job_ns=t_job_ns)


def parse_answer(line: bytes | str) -> Answer:
    """One line the server sent -> its typed answer, or ProtocolError."""
    obj = _load_object(line)
    for key in ("id", "ok"):
        if key not in obj:
            raise ProtocolError(f"an answer without {key!r}")
    unknown = sorted(set(obj) - _ANSWER_FIELDS)
    if unknown:
        raise ProtocolError(f"an answer with unknown fields {', '.join(repr(k[:40]) for k in unknown[:5])}")
    rid = None if obj["id"] is None else _request_id(obj["id"])
    if not isinstance(obj["ok"], bool):
        raise ProtocolError(f"'ok' must be a boolean, not {_shown(obj['ok'])}", rid)
    received, answered = (_nonnegative(obj, k, rid) if k in obj else None for k in ("t_received_ns", "t_answered_ns"))
    if obj["ok"]:
        if "error" in obj or "kind" in obj:
            raise ProtocolError("an ok answer with an error", rid)
        return Answer(id=rid, ok=True, t_received_ns=received, t_answered_ns=answered)
    error, kind = obj.get("error"), obj.get("kind")
    if not isinstance(error, str) or len(error) > MAX_LINE:
        raise ProtocolError("an error answer's 'error' must be a string", rid)
    if kind not in ERROR_KINDS:
        raise ProtocolError(f"an error answer's 'kind' must be one of {', '.join(ERROR_KINDS)}", rid)
    return Answer(id=rid, ok=False, t_received_ns=received, t_answered_ns=answered, error=error, kind=kind)


def encode(message: dict[str, Any]) -> bytes:
    """A message -> its line, newline included (compact, ASCII-only: no byte of it is ever ambiguous)."""
    line = json.dumps(message, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(ENCODING)
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a message of {len(line)} bytes; at most {MAX_LINE} are accepted")
    return line + b"\n"
