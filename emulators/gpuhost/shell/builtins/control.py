"""The shell's own words: echo, true, false, exit."""

from __future__ import annotations

import re

from emulators.gpuhost.shell.context import Context, Result


def echo(args: list[str], ctx: Context) -> Result:
    newline = "\n"
    if args and args[0] == "-n":
        args, newline = args[1:], ""
    return " ".join(args) + newline, "", 0


def true(args: list[str], ctx: Context) -> Result:
    return "", "", 0


def false(args: list[str], ctx: Context) -> Result:
    return "", "", 1


def exit_(args: list[str], ctx: Context) -> Result:
    """`exit [N]`: the command line ends here, with status N (the last command's when none is given)."""
    ctx.exited = True
    if not args:
        return "", "", 0
    # ASCII digits only ('²'.isdigit() is true, int('²') fails); the status is a byte, as in bash.
    if not re.fullmatch(r"-?[0-9]{1,18}", args[0]):
        return "", f"bash: exit: {args[0]}: numeric argument required\n", 2
    return "", "", int(args[0]) % 256
