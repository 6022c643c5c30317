"""`python -m testbed.events --readme results/README.md`: rewrite results/README.md's event tables from
testbed/events/schema.py and every registered procedure's marks."""

import sys
from pathlib import Path

from testbed.events.docs import render_event_docs, replace_block
from testbed.families import PROCEDURES


def main(argv: list[str]) -> int:
    if argv[:1] != ["--readme"] or len(argv) != 2:
        print("usage: python -m testbed.events --readme results/README.md", file=sys.stderr)
        return 2
    path = Path(argv[1])
    path.write_text(replace_block(path.read_text(encoding="utf-8"), render_event_docs(PROCEDURES.marks())))
    return 0


raise SystemExit(main(sys.argv[1:]))
