"""The one name for values that are arbitrary JSON: what crosses an actor's boundary or goes into a file as is."""

from __future__ import annotations

from typing import Any, TypeAlias

# Any JSON value (null, bool, number, string, array, object), as json.loads returns it. Any rather than a recursive
# union: readers index into it by what they know of its shape, which a union would make them re-check at each step.
JsonValue: TypeAlias = Any
# A JSON object: what a procedure returns, a spec as plain data, a call's keyword arguments.
JsonObject: TypeAlias = dict[str, JsonValue]
