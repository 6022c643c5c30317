"""JSON Schemas of the inventory and playbook models, for editors (yaml-language-server and others)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.config.inventory import Inventory
from testbed.config.playbook import Playbook

SCHEMAS = {"inventory.schema.json": Inventory, "playbook.schema.json": Playbook}


def schema_text(model) -> str:
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in SCHEMAS.items():
        path = out / name
        path.write_text(schema_text(model), encoding="utf-8")
        written.append(path)
    return written
