"""Toxiproxy's request bodies as its Go server decodes them (encoding/json into typed structs), so the twin's HTTP
API refuses what a real Toxiproxy refuses, with the same status and error text (docs/protocols.md §5.2).

What Go's decoder does that matters here: a JSON value goes into a field of a Go type or the request fails.
An integer field (every toxic attribute: int64, or int for slicer's) takes only a number literal without a
fraction or an exponent that fits, so 300.0 and 3e2 are refused ("cannot unmarshal number 300.0 into Go struct
field LatencyToxic.attributes.latency of type int64"); `toxicity` is a float32; names and addresses strings;
`enabled` a bool. A JSON null leaves the field as it was. A key no field has is ignored by Go (the twin is
stricter there and refuses it afterwards, naming it: http.py). The first mismatch in the body's order is the one
reported, wrapped as Toxiproxy wraps it: "bad request body: json: ...", HTTP 400.
"""

from __future__ import annotations

import json
from typing import Any

from emulators.proxy.toxics import GO_STRUCTS, SCHEMA

INT_RANGES = {"int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1)}  # Go's int is 64-bit on its builds
FLOAT32_MAX = 3.4028234663852886e38
BAD_BODY = "bad request body"

# Top-level fields of the structs the bodies decode into (Toxiproxy's ToxicWrapper and Proxy).
TOXIC_FIELDS = {"name": "string", "type": "string", "stream": "string", "toxicity": "float32"}
PROXY_FIELDS = {"name": "string", "listen": "string", "upstream": "string", "enabled": "bool"}


class GoFloat(float):
    """A JSON number with a fraction or an exponent, keeping its literal: Go's errors quote it as written."""

    literal: str

    def __new__(cls, literal: str) -> GoFloat:
        value = super().__new__(cls, literal)
        value.literal = literal
        return value


class DecodeError(ValueError):
    """The body is not what Toxiproxy's struct takes: HTTP 400 with Toxiproxy's message."""


def loads(body: bytes) -> Any:
    """The body as JSON, numbers with a fraction or exponent kept as GoFloat. An empty body is Go's "EOF"."""
    if not body.strip():
        raise DecodeError(f"{BAD_BODY}: EOF")
    try:
        return json.loads(body, parse_float=GoFloat, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"{BAD_BODY}: {exc}") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")  # NaN, Infinity: not JSON


def json_kind(value: Any) -> str:
    """Go's name for a JSON value's kind in its decoding errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object"


def literal(value: int | float) -> str:
    return value.literal if isinstance(value, GoFloat) else json.dumps(value)


def field_error(value: Any, go_type: str, struct: str, field: str) -> str | None:
    """Go's error for `value` decoded into a field of `go_type`, or None if it decodes (null always does)."""
    if value is None:
        return None
    kind = json_kind(value)
    shown = kind
    if go_type in INT_RANGES:
        lo, hi = INT_RANGES[go_type]
        if kind == "number" and isinstance(value, int) and not isinstance(value, GoFloat) and lo <= value <= hi:
            return None
        if kind == "number":
            shown = f"number {literal(value)}"  # Go quotes the literal it could not parse as an integer
    elif go_type == "float32":
        if kind == "number" and abs(float(value)) <= FLOAT32_MAX:
            return None
        if kind == "number":
            shown = f"number {literal(value)}"
    elif go_type == "string" and kind == "string" or go_type == "bool" and kind == "bool":
        return None
    return f"json: cannot unmarshal {shown} into Go struct field {struct}.{field} of type {go_type}"


def object_error(body: Any, go_value: str) -> str | None:
    """Go's error for a body that is not a JSON object (null decodes to nothing, as in Go)."""
    if body is None or isinstance(body, dict):
        return None
    return f"json: cannot unmarshal {json_kind(body)} into Go value of type {go_value}"


def first_error(errors: list[str | None]) -> None:
    """Raise the first of `errors` (Go reports the first mismatch and decodes the rest)."""
    for error in errors:
        if error is not None:
            raise DecodeError(f"{BAD_BODY}: {error}")


def check_proxy(body: Any) -> dict[str, Any]:
    """A proxy create or update body as Toxiproxy's Proxy struct takes it; null fields dropped."""
    first_error([object_error(body, "toxiproxy.Proxy")])
    body = body or {}
    first_error([field_error(v, PROXY_FIELDS[k], "Proxy", k) for k, v in body.items() if k in PROXY_FIELDS])
    return {k: v for k, v in body.items() if v is not None}


def check_toxic_wrapper(body: Any) -> dict[str, Any]:
    """A toxic create body's first decoding (Toxiproxy's ToxicWrapper, its attributes not yet typed)."""
    first_error([object_error(body, "toxics.ToxicWrapper")])
    body = body or {}
    errors = []
    for key, value in body.items():
        if key in TOXIC_FIELDS:
            errors.append(field_error(value, TOXIC_FIELDS[key], "ToxicWrapper", key))
        elif key == "attributes" and value is not None and not isinstance(value, dict):
            # Before the type is known, Toxiproxy decodes attributes into its no-op toxic: an object is all it takes.
            kind = json_kind(value)
            into = "Go struct field ToxicWrapper.attributes of type toxics.NoopToxic"
            errors.append(f"json: cannot unmarshal {kind} into {into}")
    first_error(errors)
    return {k: v for k, v in body.items() if v is not None}


def check_attributes(toxic_type: str, attributes: Any) -> dict[str, Any]:
    """A toxic's attributes decoded into its type's struct (LatencyToxic, ...); null ones dropped."""
    struct = GO_STRUCTS[toxic_type]
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        kind = json_kind(attributes)
        first_error([f"json: cannot unmarshal {kind} into Go struct field .attributes of type toxics.{struct}"])
    schema = SCHEMA[toxic_type]
    first_error([field_error(v, schema[k], struct, f"attributes.{k}") for k, v in attributes.items() if k in schema])
    return {k: v for k, v in attributes.items() if v is not None}


def check_toxic_update(toxic_type: str, body: Any) -> dict[str, Any]:
    """A toxic update body: Toxiproxy decodes it into an unnamed struct of `attributes` and `toxicity`."""
    first_error([object_error(body, "struct { Attributes interface {}; Toxicity float32 }")])
    body = body or {}
    errors = []
    for key, value in body.items():
        if key == "toxicity":
            errors.append(field_error(value, "float32", "", "toxicity"))
        elif key == "attributes":
            try:
                check_attributes(toxic_type, value)
            except DecodeError as exc:
                errors.append(str(exc).removeprefix(f"{BAD_BODY}: "))
    first_error(errors)
    return {k: v for k, v in body.items() if v is not None}
