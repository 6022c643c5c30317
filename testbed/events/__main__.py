"""`python -m testbed.events --readme results/README.md`: rewrite the generated event tables."""

import sys

from testbed.events.schema import main

raise SystemExit(main(sys.argv[1:]))
