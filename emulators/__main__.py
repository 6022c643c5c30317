"""`python -m emulators serve SPEC_FILE [--exit-on-stdin-eof]` — run a twin (see emulators/twin.py).

SPEC_FILE is a TwinSpec as JSON, or `-` for stdin. With `-` the spec is read up to the end of the
first complete JSON document, not to EOF: TwinProcess keeps stdin open as a lifeline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from emulators.spec import TwinSpec
from emulators.twin import serve


def _read_spec_from_stdin() -> str:
    # os.read, not sys.stdin: nothing may sit in a Python buffer once the EOF watcher takes over fd 0.
    decoder, buf = json.JSONDecoder(), b""
    while chunk := os.read(0, 65536):
        buf += chunk
        try:
            decoder.raw_decode(buf.decode().strip())
            break
        except ValueError:  # incomplete so far (UnicodeDecodeError is a ValueError too)
            continue
    return buf.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulators", description="Run emulated lab devices.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="serve a twin and print its endpoints as one JSON line")
    p_serve.add_argument("spec_file", help="TwinSpec JSON file, or - for stdin")
    p_serve.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (the parent died)")
    args = parser.parse_args(argv)

    try:
        if args.spec_file == "-":
            text = _read_spec_from_stdin()
        else:
            with open(args.spec_file, encoding="utf-8") as f:
                text = f.read()
        spec = TwinSpec.from_json(text)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        print(f"emulators: cannot read twin spec {args.spec_file!r}: {what}", file=sys.stderr)
        return 2
    try:
        return serve(spec, exit_on_stdin_eof=args.exit_on_stdin_eof)
    except ValueError as exc:  # an inconsistent spec (e.g. size 0, duplicate names)
        print(f"emulators: invalid twin spec: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
