"""Events: what a run records, in one vocabulary (schema), read back by one reader (jsonl); the faults a run
injected and healed, read from them by one reader (faults).

It imports nothing of testbed but its errors (docs/architecture.md, "Layers").
"""

from testbed.events.faults import FaultRecord, active_faults, read_faults
from testbed.events.jsonl import JsonlError, JsonlFile, read_events, read_jsonl, set_aside_torn_line
from testbed.events.ledger import InvokeLedger, orphan_outcome
from testbed.events.record import Event, EventType, Observer, now
from testbed.events.schema import FORMAT_VERSION, Op, SchemaError

__all__ = [
    "FORMAT_VERSION",
    "Event",
    "EventType",
    "FaultRecord",
    "InvokeLedger",
    "JsonlError",
    "JsonlFile",
    "Observer",
    "Op",
    "SchemaError",
    "active_faults",
    "now",
    "orphan_outcome",
    "read_events",
    "read_faults",
    "read_jsonl",
    "set_aside_torn_line",
]
