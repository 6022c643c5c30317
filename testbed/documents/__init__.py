"""The inventory and the playbook as whole documents: the only place where files become models.

The inventory's devices are the union of every registered family's model, the playbook's steps the union of
every registered step kind: built here, above the families and the steps, from the base models they share
(testbed.config). Loading a file validates it against them and cross-checks the two (testbed.documents.checks).
"""

from __future__ import annotations

from testbed.documents.inventory import Inventory
from testbed.documents.load import Loaded, declared_inventory, detect_kind, load_inventory, load_playbook
from testbed.documents.playbook import Playbook

__all__ = ["Inventory", "Loaded", "Playbook", "declared_inventory", "detect_kind", "load_inventory", "load_playbook"]
