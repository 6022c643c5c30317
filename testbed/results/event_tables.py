"""`python -m testbed.results.event_tables --readme results/README.md`: rewrite results/README.md's event tables
from testbed/events/schema.py and every registered procedure's marks (a test keeps them equal).
"""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.events.docs import render_event_docs, replace_block
from testbed.families import PROCEDURES

USAGE = "usage: python -m testbed.results.event_tables --readme results/README.md"


def main(argv: list[str]) -> int:
    if argv[:1] != ["--readme"] or len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    path = Path(argv[1])
    path.write_text(replace_block(path.read_text(encoding="utf-8"), render_event_docs(PROCEDURES.marks())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
