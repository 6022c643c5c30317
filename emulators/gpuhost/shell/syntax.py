"""The command language's syntax: a command line cut into simple commands joined by operators, and a simple
command cut into its assignments, its words, its redirections and the directory `env -C` runs it in.

A command line is split as shlex splits it (operators must stand apart from words, as the driver writes them,
except a `;` ending a word). A simple command is
`[NAME=VALUE ...] [setsid|nohup|env [-C DIR] [NAME=VALUE ...]|exec] WORD ARGS [REDIRECTION ...]`.
The compound commands are `while LIST ; do LIST ; done` and the group `{ LIST ; }`, which may stand wherever a
simple command does (without redirections of their own).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

OPERATORS = ("&&", "||", ";", "&")
UNSUPPORTED = ("|", "||&", "|&", "$(", "`")  # pipes and command substitution: refused, not misread
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
REDIRECTS = ("2>&1", ">&2", "1>&2", ">>", "2>>", "&>", ">", "1>", "2>", "<")
PREFIXES = ("setsid", "nohup", "env", "exec")  # words that run the command after them as it is

_QUOTING = re.compile(r"[\"'\\]")
_BLANKS = re.compile(r"[ \t\r\n]+")  # shlex's whitespace; str.split() would also split on \x0b, \xa0, ...


class ShellSyntaxError(Exception):
    """A command line or simple command bash would refuse; its message is what bash says after `bash: `."""


@dataclass
class Segment:
    """One simple command's words (or a loop), and the operator after it (None at the end of the line)."""

    words: list[str]
    separator: str | None
    loop: Loop | None = None
    group: list[Segment] | None = None  # `{ LIST ; }`

    @property
    def background(self) -> bool:
        return self.separator == "&"


@dataclass
class Loop:
    """`while CONDITION ; do BODY ; done`: BODY runs as long as CONDITION's last command succeeds."""

    condition: list[Segment]
    body: list[Segment]


@dataclass
class Redirections:
    stdout: tuple[str, bool] | None = None  # (path, append)
    stderr: tuple[str, bool] | None = None
    stderr_to_stdout: bool = False
    stdout_to_stderr: bool = False
    stdin: str | None = None


@dataclass
class SimpleCommand:
    words: list[str]  # the command's name and arguments
    assignments: dict[str, str] = field(default_factory=dict)  # its environment's additions
    redirections: Redirections = field(default_factory=Redirections)
    chdir: str | None = None  # `env -C DIR`


def words(command: str) -> list[str]:
    """shlex.split(command, posix=True), without its character-by-character scan when there is no quoting
    to interpret (a health probe's command line is 200 characters, and 64 hosts share one twin).
    """
    if _QUOTING.search(command):
        return shlex.split(command, comments=False, posix=True)
    return [w for w in _BLANKS.split(command) if w]


def tokens(command: str) -> list[str]:
    """The words of `command`, a `;` that ends a word split off it as bash reads `a; b`."""
    out = []
    for tok in words(command):
        if len(tok) > 1 and tok.endswith(";") and not tok.endswith("\\;"):
            out += [tok[:-1], ";"]
        else:
            out.append(tok)
    return out


def parse_line(command: str) -> list[Segment]:
    """The commands of a command line, in order; ShellSyntaxError for what bash or this host refuses."""
    try:
        toks = tokens(command)
    except ValueError as exc:
        raise ShellSyntaxError(f"-c: line 1: syntax error: {exc}") from None
    segments, end = _list(toks, 0, ())
    if end < len(toks):
        raise _unexpected(toks[end])
    return segments


def _list(toks: list[str], i: int, stops: tuple[str, ...]) -> tuple[list[Segment], int]:
    """The commands from toks[i] up to the end or a word of `stops` where a command would begin (bash's
    reserved words count only there); returns them and where they ended.
    """
    segments: list[Segment] = []
    current: list[str] = []
    while i < len(toks):
        tok = toks[i]
        if not current and tok in stops:
            break
        if tok in OPERATORS:
            if not current:
                raise _unexpected(tok)
            segments.append(Segment(current, tok))
            current = []
        elif tok in UNSUPPORTED:
            raise ShellSyntaxError(f"emulated host: `{tok}' is not supported")
        elif not current and tok in ("while", "{"):
            loop, group = None, None
            if tok == "while":
                loop, i = _while(toks, i + 1)
            else:
                group, i = _group(toks, i + 1)
            if i < len(toks) and toks[i] not in OPERATORS and toks[i] not in stops:
                if toks[i].startswith(REDIRECTS):
                    what = "loop" if tok == "while" else "group"
                    raise ShellSyntaxError(f"emulated host: a {what}'s redirection `{toks[i]}' is not supported")
                raise _unexpected(toks[i])
            separator = toks[i] if i < len(toks) and toks[i] in OPERATORS else None
            segments.append(Segment([tok], separator, loop, group))
            i += separator is not None
            continue
        elif not current and tok in ("do", "done", "}"):
            raise _unexpected(tok)
        else:
            current.append(tok)
        i += 1
    if current:
        segments.append(Segment(current, None))
    return segments, i


def _while(toks: list[str], i: int) -> tuple[Loop, int]:
    """The loop whose condition starts at toks[i]; returns it and the index after its `done`."""
    condition, i = _list(toks, i, ("do",))
    if i == len(toks):
        raise ShellSyntaxError("-c: line 1: syntax error: unexpected end of file")
    if not condition:
        raise _unexpected("do")
    body, i = _list(toks, i + 1, ("done",))
    if i == len(toks):
        raise ShellSyntaxError("-c: line 1: syntax error: unexpected end of file")
    if not body:
        raise _unexpected("done")
    return Loop(condition, body), i + 1


def _group(toks: list[str], i: int) -> tuple[list[Segment], int]:
    """The group whose list starts at toks[i]; returns it and the index after its `}` (which, as in bash, ends it
    only where a command would begin: `{ echo a ; }`, not `{ echo a }`).
    """
    body, i = _list(toks, i, ("}",))
    if i == len(toks):
        raise ShellSyntaxError("-c: line 1: syntax error: unexpected end of file")
    if not body:
        raise _unexpected("}")
    return body, i + 1


def _unexpected(tok: str) -> ShellSyntaxError:
    return ShellSyntaxError(f"-c: line 1: syntax error near unexpected token `{tok}'")


def parse_simple(expanded: list[str]) -> SimpleCommand:
    """A simple command's (expanded) words taken apart; ShellSyntaxError for a redirection without a target."""
    redirections, rest = _redirections(expanded)
    assignments: dict[str, str] = {}
    i = 0
    while i < len(rest) and ASSIGNMENT.match(rest[i]):
        k, _, v = rest[i].partition("=")
        assignments[k] = v
        i += 1
    chdir = None
    while i < len(rest) and rest[i] in PREFIXES:
        if rest[i] == "env":
            i += 1
            while i < len(rest):
                if rest[i] in ("-C", "--chdir") and i + 1 < len(rest):
                    chdir, i = rest[i + 1], i + 2
                elif rest[i].startswith("--chdir="):
                    chdir, i = rest[i].split("=", 1)[1], i + 1
                elif ASSIGNMENT.match(rest[i]):
                    k, _, v = rest[i].partition("=")
                    assignments[k] = v
                    i += 1
                else:
                    break
        else:
            i += 1
            if i < len(rest) and rest[i - 1] == "setsid" and rest[i] in ("-f", "--fork", "-w", "--wait"):
                i += 1
    return SimpleCommand(rest[i:], assignments, redirections, chdir)


def _redirections(expanded: list[str]) -> tuple[Redirections, list[str]]:
    """The redirections among a simple command's words, wherever they stand, and the other words in order."""
    r = Redirections()
    rest: list[str] = []
    it = iter(expanded)
    for w in it:
        op = next((o for o in REDIRECTS if w.startswith(o)), None)
        if op is None:
            rest.append(w)
            continue
        if op in ("2>&1", ">&2", "1>&2"):
            if w != op:
                rest.append(w)
                continue
            if op == "2>&1":
                r.stderr_to_stdout = True
            else:
                r.stdout_to_stderr = True
            continue
        target = w[len(op) :] or next(it, None)
        if not target:
            raise ShellSyntaxError("syntax error near unexpected token `newline'")
        if op == "<":
            r.stdin = target
        elif op in (">", "1>", ">>"):
            r.stdout = (target, op == ">>")
        elif op in ("2>", "2>>"):
            r.stderr = (target, op == "2>>")
        elif op == "&>":
            r.stdout, r.stderr_to_stdout = (target, False), True
    return r, rest
