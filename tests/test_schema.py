"""Editors read playbooks/schema/*.json; they must match the models the loader enforces."""

from __future__ import annotations

import json

from testbed.cli.main import main
from testbed.documents.json_schema import SCHEMAS, schema_text


def test_committed_schemas_match_the_models(repo):
    for name, model in SCHEMAS.items():
        committed = (repo / "playbooks/schema" / name).read_text()
        assert committed == schema_text(model), f"run `testbed schema --out playbooks/schema` ({name} is stale)"


def test_schema_command_writes_both_files(tmp_path):
    assert main(["schema", "--out", str(tmp_path)]) == 0
    inventory = json.loads((tmp_path / "inventory.schema.json").read_text())
    playbook = json.loads((tmp_path / "playbook.schema.json").read_text())
    assert "devices" in inventory["properties"] and inventory["additionalProperties"] is False
    assert "steps" in playbook["required"]
