"""JSON Schemas of the inventory and playbook files, for editors (yaml-language-server and others).

The playbook's is its model's. The inventory's is its model's plus the shorthands the loader expands first
(testbed/config/expand.py): range keys under `devices:`, top-level `groups:` and `group:` on a device, `for:`
patterns in `fibres:` and `trunks:`, ranges in `spares:`. A ranged device or a pattern may put a template where
a number or a name goes, so those branches also take a template string there; a device with `group:` gets the
rest of its fields from its group, so its branch asks for little. The loader checks the expanded values.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

from testbed.config.common import NAME_PATTERN
from testbed.documents.inventory import Inventory
from testbed.documents.playbook import Playbook

RANGE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]*\[[0-9]+:[0-9]+\][A-Za-z0-9_.-]*$"
NAME_OR_RANGE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]*(\[[0-9]+:[0-9]+\][A-Za-z0-9_.-]*)?$"
TEMPLATE = {
    "type": "string",
    "pattern": r"\{[^{}]*\}",
    "description": 'a template, e.g. "{256 + n}" or "h{n:03d}": variables, integers, + - * // % and parentheses',
}
LOOPS = {
    "type": "object",
    "minProperties": 1,
    "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
    "additionalProperties": {
        "anyOf": [{"type": "string", "pattern": r"^\s*-?[0-9]+\s*\.\.\s*-?[0-9]+\s*$"}, {"type": "integer"}]
    },
    "description": "one entry per combination of these variables' values, the first variable outermost: "
    "{n: 1..256, k: 0..7} (inclusive); the entry's other fields are templates over them",
}


def inventory_schema() -> dict:
    schema = Inventory.model_json_schema()
    defs, props = schema["$defs"], schema["properties"]
    device = props["devices"]["patternProperties"][NAME_PATTERN]  # the union of every family's device
    grouped = {
        "type": "object",
        "required": ["group"],
        "properties": {"group": {"type": "string", "pattern": NAME_PATTERN, "description": "a key of groups:"}},
        "description": "a device that takes the fields it does not set from its group",
    }
    props["devices"] = {
        "title": "Devices",
        "type": "object",
        "description": "devices by name; a key such as gpu[001:256] is a range of devices, one per name, whose "
        "fields are templates over {name} and {i}",
        "patternProperties": {
            NAME_PATTERN: {"anyOf": [device, grouped]},
            RANGE_PATTERN: {"anyOf": [_templated(device, defs), grouped]},
        },
        "additionalProperties": False,
    }
    props["groups"] = {
        "title": "Groups",
        "type": "object",
        "description": "default fields by group name, for the devices that say group: <name>; a device's own "
        "field replaces the group's whole; the fields are templates over {name} (and {i} in a range)",
        "patternProperties": {NAME_PATTERN: {"type": "object"}},
        "additionalProperties": False,
    }
    for key in ("fibres", "trunks"):
        entry = props[key]["items"]
        name = entry["$ref"].rsplit("/", 1)[1]
        _templated(entry, defs)  # makes its templated twin, e.g. FibreTemplate
        pattern = copy.deepcopy(defs[f"{name}Template"])
        pattern["properties"]["for"] = LOOPS
        pattern["required"] = ["for", *pattern.get("required", [])]
        pattern["title"] = f"{name}Pattern"
        defs[f"{name}Pattern"] = pattern
        props[key]["items"] = {"anyOf": [entry, {"$ref": f"#/$defs/{name}Pattern"}]}
    props["spares"]["items"] = {"type": "string", "pattern": NAME_OR_RANGE_PATTERN}
    return schema


def _templated(node, defs: dict):
    """`node` with a template string allowed wherever a number, a boolean or a constrained string goes; each
    referenced definition gets a templated twin (`FibreTemplate`). `kind` and `type` tags (const) stay as they
    are: they choose the device or transport model.
    """
    if isinstance(node, list):
        return [_templated(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        twin = f"{name}Template"
        if twin not in defs:
            defs[twin] = {}  # claimed first: a definition that refers to itself stops here
            defs[twin] = _templated(defs[name], defs)
        return {**node, "$ref": f"#/$defs/{twin}"}
    if "const" in node:
        return node
    if node.get("type") in ("integer", "number", "boolean") or "pattern" in node or "enum" in node:
        return {"anyOf": [node, TEMPLATE]}
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {k: _templated(v, defs) for k, v in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties", "prefixItems"):
            out[key] = _templated(value, defs)
        elif key == "discriminator":
            mapping = {k: f"{ref}Template" for k, ref in value.get("mapping", {}).items()}
            out[key] = {**value, "mapping": mapping}
        else:
            out[key] = value
    return out


SCHEMAS: dict[str, Callable[[], dict]] = {
    "inventory.schema.json": inventory_schema,
    "playbook.schema.json": Playbook.model_json_schema,
}


def schema_text(build: Callable[[], dict]) -> str:
    schema = build()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in SCHEMAS.items():
        path = out / name
        path.write_text(schema_text(build), encoding="utf-8")
        written.append(path)
    return written
