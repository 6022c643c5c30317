"""python -m emulators.proxy [--port 8474] [--seed 0]: a standalone Toxiproxy-compatible API server."""

from __future__ import annotations

import argparse
import contextlib

from emulators.endpoints import precise_event_loop
from emulators.proxy.http import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulators.proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="loopback address for the API")
    parser.add_argument("--port", type=int, default=8474, help="API port (Toxiproxy's default: 8474)")
    parser.add_argument("--seed", type=int, default=0, help="seed for toxicity and jitter draws")
    args = parser.parse_args(argv)
    loop = precise_event_loop()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            loop.run_until_complete(serve(args.host, args.port, args.seed))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
