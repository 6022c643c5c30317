"""The words of a selection of runs (`testbed gate`'s --baseline and --candidate) and the gate's default limit: a
module of its own, with no imports, so that the command's parser names them without loading the gate's statistics
(testbed.catalog.gate, which reads them from here).
"""

DEFAULT_MAX_SLOWDOWN_PCT = 5.0
KEYS = ("run", "playbook", "inventory", "target", "status", "since", "until", "commit", "tag", "protocol", "owner")
