"""`grep [-qsEFivc] [-e] PATTERN FILE...`: the lines of files that match, as GNU grep selects them; the exit
status says whether any did (0), none did (1), or a file could not be read (2, unless -q found a match).

Patterns are POSIX regular expressions, basic (BRE) or with -E extended (ERE), matched with Python's re: the
two agree on what the driver and a user write (classes, anchors, groups, repetition); POSIX classes such as
[[:digit:]] and back-references are refused rather than misread.
"""

from __future__ import annotations

import re

from emulators.gpuhost.shell.builtins.files import read_file
from emulators.gpuhost.shell.context import Context, Result

FLAGS = set("qsEFivc")
USAGE = "Usage: grep [OPTION]... PATTERNS [FILE]...\nTry 'grep --help' for more information.\n"
BRE_SPECIAL = "(){}|+?"  # literal in a BRE unless escaped; special in an ERE unless escaped


def grep(args: list[str], ctx: Context) -> Result:
    flags: set[str] = set()
    pattern: str | None = None
    files: list[str] = []
    it = iter(args)
    for a in it:
        if files or pattern is not None and not a.startswith("-"):
            files.append(a)
        elif a == "-e":
            pattern = next(it, None)
            if pattern is None:
                return "", "grep: option requires an argument -- 'e'\n", 2
        elif a.startswith("-") and len(a) > 1:
            unknown = set(a[1:]) - FLAGS
            if unknown:
                return "", f"grep: invalid option -- '{sorted(unknown)[0]}'\n{USAGE}", 2
            flags |= set(a[1:])
        else:
            pattern = a
    if pattern is None:
        return "", USAGE, 2
    if not files:
        return "", "grep: reading standard input is not supported on the emulated host\n", 2
    try:
        rx = compile_pattern(pattern, extended="E" in flags, fixed="F" in flags, fold="i" in flags)
    except ValueError as exc:
        return "", f"grep: {exc}\n", 2
    out, err, found, failed = [], "", False, False
    for name in files:
        data, e = read_file("grep", name, ctx)
        if data is None:
            err, failed = err + ("" if "s" in flags else e), True
            continue
        lines = data.decode("utf-8", errors="replace").splitlines()
        chosen = [line for line in lines if (rx.search(line) is None) == ("v" in flags)]
        found |= bool(chosen)
        if "q" in flags and found:
            return "", err, 0  # GNU grep -q stops at the first match, whatever it could not read
        prefix = f"{name}:" if len(files) > 1 else ""
        if "c" in flags:
            out.append(f"{prefix}{len(chosen)}\n")
        elif "q" not in flags:
            out += [f"{prefix}{line}\n" for line in chosen]
    return "".join(out), err, 2 if failed else 0 if found else 1


def compile_pattern(pattern: str, *, extended: bool, fixed: bool, fold: bool) -> re.Pattern:
    """A POSIX regular expression (or, fixed, a string) as a Python one; ValueError for what it cannot take."""
    if fixed:
        text = re.escape(pattern)
    else:
        if "[:" in pattern or re.search(r"\\[1-9]", pattern):
            raise ValueError(f"emulated host: POSIX classes and back-references are not supported: {pattern!r}")
        text = pattern if extended else _from_bre(pattern)
    try:
        return re.compile(text, re.IGNORECASE if fold else 0)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def _from_bre(pattern: str) -> str:
    """A BRE as an ERE: `\\(` and the like become operators, a bare `(` and the like literal characters."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(nxt if nxt in BRE_SPECIAL else c + nxt)
            i += 2
            continue
        out.append("\\" + c if c in BRE_SPECIAL else c)
        i += 1
    return "".join(out)
