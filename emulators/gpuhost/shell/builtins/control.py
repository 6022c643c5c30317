"""The shell's own words: echo, true, false, exit; and sleep."""

from __future__ import annotations

import re
import time

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


SLEEP_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
SLEEP_SLICE_S = 0.05  # how soon a sleep notices its reader went away


def sleep(args: list[str], ctx: Context) -> Result:
    """GNU `sleep NUMBER[smhd]...`: the sum of its arguments, in seconds (fractions allowed). It ends early when
    the subshell running it is killed or the command line's reader went away.
    """
    if not args:
        return "", "sleep: missing operand\nTry 'sleep --help' for more information.\n", 1
    total = 0.0
    for a in args:
        number, unit = (a[:-1], a[-1]) if a[-1:] in "smhd" and len(a) > 1 else (a, "")
        try:
            seconds = float(number)  # as strtod reads it: 0.05, 5e-2, inf
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or number.strip() != number:
            return "", f"sleep: invalid time interval '{a}'\nTry 'sleep --help' for more information.\n", 1
        total += seconds * SLEEP_UNITS[unit]
    end = time.monotonic() + total
    while (left := end - time.monotonic()) > 0 and not ctx.cancelled():
        if ctx.ended.wait(min(left, SLEEP_SLICE_S)):
            break
    return "", "", 0
