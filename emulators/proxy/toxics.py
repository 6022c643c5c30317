"""Toxic definitions: validation, and the per-connection stage each toxic applies to a byte stream.

A direction of a proxied connection is a sequence of items read from its source: data chunks and
one end-of-stream. Each item carries the loop time at which it may be written to the destination.
The toxics of that direction (those whose toxicity draw selected this connection), in the order
they were added, rewrite the item list at read time: delay it (latency, bandwidth, slicer,
slow_close), drop it (timeout, reset_peer), or cut the stream with a close (limit_data). The
writer then releases items in order, each no earlier than its time and never before the item
ahead of it (so delays never reorder bytes, and delays of back-to-back chunks do not add up,
as in Toxiproxy, which stamps each chunk with the time it was read).

Attribute names and units are Toxiproxy's (latency/jitter/delay/timeout in ms, slicer delay in
microseconds, rate in KB/s with KB = 1000 bytes, bytes in bytes). The Python API also accepts
unit-suffixed aliases (latency_ms, jitter_ms, rate_kbps, delay_ms, timeout_ms, delay_us); state and
JSON always use Toxiproxy's names (the HTTP API takes no alias: Toxiproxy would ignore one). An attribute left
out is 0, as in Toxiproxy. Every attribute is an integer in Toxiproxy, and the HTTP API refuses a float as
Toxiproxy's JSON decoding does (emulators/proxy/gojson.py); the Python API and the twin's control ops, which are
the twin's own, also take fractions of times and rates (COUNTS below are integers everywhere).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

STREAMS = ("upstream", "downstream")  # upstream = client -> server, downstream = server -> client

DATA, EOF, CLOSE = "data", "eof", "close"

# type -> attribute -> its Go type in Toxiproxy (every attribute is an integer there: a fraction is refused), and
# the Go struct each type decodes into, whose name Toxiproxy's decoding errors carry (emulators/proxy/gojson.py).
SCHEMA: dict[str, dict[str, str]] = {
    "latency": {"latency": "int64", "jitter": "int64"},
    "bandwidth": {"rate": "int64"},
    "slow_close": {"delay": "int64"},
    "timeout": {"timeout": "int64"},
    "reset_peer": {"timeout": "int64"},
    "slicer": {"average_size": "int", "size_variation": "int", "delay": "int"},
    "limit_data": {"bytes": "int64"},
}
# What the Python API and control ops (the twin's own, not Toxiproxy's) take only as integers: counts of bytes.
# Times and rates may be fractions there (the driver tests slow a reply with 0.1 KB/s), which Toxiproxy cannot
# express; its HTTP API refuses any float, as Toxiproxy does.
COUNTS = frozenset({"average_size", "size_variation", "bytes"})
GO_STRUCTS: dict[str, str] = {
    "latency": "LatencyToxic",
    "bandwidth": "BandwidthToxic",
    "slow_close": "SlowCloseToxic",
    "timeout": "TimeoutToxic",
    "reset_peer": "ResetToxic",
    "slicer": "SlicerToxic",
    "limit_data": "LimitDataToxic",
}
ALIASES: dict[str, dict[str, str]] = {
    "latency": {"latency_ms": "latency", "jitter_ms": "jitter"},
    "bandwidth": {"rate_kbps": "rate"},
    "slow_close": {"delay_ms": "delay"},
    "timeout": {"timeout_ms": "timeout"},
    "reset_peer": {"timeout_ms": "timeout"},
    "slicer": {"delay_us": "delay"},
    "limit_data": {},
}
MAX_DELAY_MS = 7 * 24 * 3600 * 1000  # a week: anything longer is a typo, not a test


class NotFoundError(LookupError):
    """No proxy or toxic of that name (HTTP 404)."""

    def __str__(self) -> str:  # KeyError-style quoting would garble the message
        return str(self.args[0]) if self.args else ""


class ConflictError(ValueError):
    """A proxy or toxic of that name already exists (HTTP 409)."""


@dataclass
class Item:
    kind: str  # DATA, EOF or CLOSE
    at: float  # loop time before which the item must not be written
    data: bytes = b""


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int | float]  # integers when made through the HTTP API

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def make_toxic(
    name: Any,
    type: Any,
    stream: Any = "downstream",
    toxicity: Any = 1.0,
    attributes: Any = None,
    *,
    aliases: bool = True,
) -> Toxic:
    """Validate everything about one toxic; raises ValueError naming the offending field. `aliases`: whether the
    unit-suffixed names are taken (the Python API and control ops; not the HTTP API).
    """
    if not isinstance(type, str) or type not in SCHEMA:
        raise ValueError(f"unknown toxic type {type!r} (types: {', '.join(SCHEMA)})")
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable() or "/" in name:
        raise ValueError(f"toxic name must be a non-empty printable string without '/', got {name!r}")
    if stream not in STREAMS:
        raise ValueError(f"toxic stream must be 'upstream' or 'downstream', got {stream!r}")
    if not _is_number(toxicity) or not 0.0 <= toxicity <= 1.0:
        raise ValueError(f"toxicity must be a number from 0 to 1, got {toxicity!r}")
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict):
        raise ValueError(f"attributes must be an object, got {attributes!r}")
    schema, spelled = SCHEMA[type], (ALIASES[type] if aliases else {})  # alias -> attribute
    values: dict[str, int | float] = {key: 0 for key in schema}
    seen: set[str] = set()
    for raw_key, value in attributes.items():
        key = spelled.get(raw_key, raw_key)
        if key not in schema:
            allowed = sorted([*schema, *spelled])
            raise ValueError(f"{type} toxic has no attribute {raw_key!r} (attributes: {', '.join(allowed)})")
        if key in seen:
            raise ValueError(f"{type} toxic attribute {key!r} given twice (once by its alias)")
        seen.add(key)
        if not _is_number(value) or value < 0:
            raise ValueError(f"{type} toxic attribute {raw_key!r} must be a number >= 0, got {value!r}")
        if key in COUNTS:
            if value != int(value):
                raise ValueError(f"{type} toxic attribute {raw_key!r} must be an integer, got {value!r}")
            value = int(value)
        limit = MAX_DELAY_MS * (1000 if type == "slicer" else 1)  # slicer's delay is in microseconds
        if key in ("latency", "jitter", "delay", "timeout") and value > limit:
            raise ValueError(f"{type} toxic attribute {raw_key!r} is absurdly large: {value!r}")
        values[key] = value
    if type == "slicer":
        if values["average_size"] < 1:
            raise ValueError("slicer toxic needs average_size >= 1")
        if values["size_variation"] >= values["average_size"]:
            raise ValueError("slicer toxic needs size_variation < average_size")
    return Toxic(name, type, stream, float(toxicity), values)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class ToxicState:
    """What one toxic remembers about one direction of one connection."""

    rng: random.Random
    applies: bool
    record: list[float] = field(default_factory=list)  # latency: drawn delays (ms), first RECORD_LIMIT
    free_at: float = 0.0  # bandwidth: when the simulated link is next idle
    passed: int = 0  # limit_data: bytes let through so far
    armed: bool = False  # reset_peer: first item seen, reset scheduled


RECORD_LIMIT = 256


def apply(toxic: Toxic, state: ToxicState, items: list[Item], now: float) -> tuple[list[Item], float | None]:
    """Run `items` through one toxic. Returns the new items and, for reset_peer, when to reset."""
    a = toxic.attributes
    kind = toxic.type
    out: list[Item] = []
    reset_at: float | None = None
    for item in items:
        if item.kind == CLOSE:
            out.append(item)
        elif kind == "latency":
            if item.kind == DATA:
                delay = float(a["latency"])
                if a["jitter"] > 0:
                    delay += state.rng.uniform(-a["jitter"], a["jitter"])
                delay = max(0.0, delay)
                if len(state.record) < RECORD_LIMIT:
                    state.record.append(delay)
                item = Item(DATA, item.at + delay / 1000, item.data)
            out.append(item)
        elif kind == "bandwidth":
            rate = a["rate"] * 1000.0  # bytes per second
            if item.kind != DATA or rate <= 0:
                out.append(item)
                continue
            piece = max(1, int(rate / 10))  # 100 ms worth, as Toxiproxy paces large chunks
            for i in range(0, len(item.data), piece):
                part = item.data[i : i + piece]
                state.free_at = max(state.free_at, item.at) + len(part) / rate
                out.append(Item(DATA, state.free_at, part))
        elif kind == "slicer":
            if item.kind != DATA:
                out.append(item)
                continue
            bounds = _slice(state.rng, 0, len(item.data), int(a["average_size"]), int(a["size_variation"]))
            step = a["delay"] / 1e6
            for n, (lo, hi) in enumerate(bounds):
                out.append(Item(DATA, item.at + n * step, item.data[lo:hi]))
        elif kind == "slow_close":
            out.append(Item(EOF, item.at + a["delay"] / 1000) if item.kind == EOF else item)
        elif kind == "timeout":
            if item.kind == EOF:  # the source closing still closes, as in Toxiproxy
                out.append(item)
        elif kind == "reset_peer":
            if not state.armed:  # the first item arms it (Toxiproxy waits for data too)
                state.armed = True
                reset_at = max(item.at, now) + a["timeout"] / 1000
        elif kind == "limit_data":
            if item.kind == EOF:
                out.append(item)
                continue
            remaining = int(a["bytes"]) - state.passed
            if remaining > 0:
                part = item.data[:remaining]
                state.passed += len(part)
                out.append(Item(DATA, item.at, part))
            if state.passed >= a["bytes"]:
                out.append(Item(CLOSE, item.at))
        else:  # pragma: no cover - make_toxic rejects unknown types
            raise AssertionError(kind)
    return out, reset_at


def _slice(rng: random.Random, start: int, end: int, average: int, variation: int) -> list[tuple[int, int]]:
    """Toxiproxy's slicer: halve around the middle (+/- variation) until pieces are near `average`."""
    out: list[tuple[int, int]] = []
    stack = [(start, end)]
    while stack:
        lo, hi = stack.pop()
        if (hi - lo) - average <= variation:
            if hi > lo:
                out.append((lo, hi))
            continue
        mid = lo + (hi - lo) // 2 + (rng.randint(-variation, variation) if variation else 0)
        mid = min(max(mid, lo + 1), hi - 1)
        stack.append((mid, hi))
        stack.append((lo, mid))
    return out
