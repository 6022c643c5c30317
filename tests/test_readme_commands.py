"""The README's command table has every command of `testbed --help` (subcommands such as `lease acquire` and
`runs tag` included), names none that does not exist, and shows every option each one takes. The test reads the
table and the CLI's own parser, so a command or an option added without its row fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from testbed.cli.main import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"


def parser_commands(parser: argparse.ArgumentParser, path: str = "") -> dict[str, set[str]]:
    """Command path ("run", "lease acquire") -> its long options, for every command a user can type: a command
    with subcommands counts itself only when it takes options of its own (`testbed runs` lists runs).
    """
    found: dict[str, set[str]] = {}
    options = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path and (options or not subparsers):
        found[path] = options
    for action in subparsers:
        for name, sub in action.choices.items():
            found |= parser_commands(sub, f"{path} {name}".strip())
    return found


def readme_commands(text: str) -> dict[str, set[str]]:
    """Command path -> the options its rows show, from the README's command table (each `testbed ...` code span of
    a row's first cell; [SELECTION] stands for the options the paragraph after the table gives it).
    """
    begin = text.index("<!-- commands")
    table, _, after = text[begin:].partition("\n\n")
    selection = set(re.findall(r"--[a-z][a-z-]*", after.partition("\n\n")[0])) - {"--help"}
    found: dict[str, set[str]] = {}
    for line in table.splitlines():
        if not line.startswith("| `testbed"):
            continue
        first_cell = line.split(" | ")[0]
        for usage in re.findall(r"`(testbed [^`]*)`", first_cell):
            words = []  # the command's words: up to its first argument (PLAYBOOK, [--x], RUN_DIR...)
            for word in usage.split()[1:]:
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                words.append(word)
            options = set(re.findall(r"--[a-z][a-z-]*", usage)) | (selection if "SELECTION" in usage else set())
            found.setdefault(" ".join(words), set()).update(options)
    return found


def command_problems(parser: argparse.ArgumentParser, text: str) -> list[str]:
    actual, documented = parser_commands(parser), readme_commands(text)
    problems = [f"testbed {c}: in the README's table, not a command" for c in sorted(set(documented) - set(actual))]
    problems += [f"testbed {c}: a command, not in the README's table" for c in sorted(set(actual) - set(documented))]
    for command in sorted(set(actual) & set(documented)):
        problems += [f"testbed {command} {o}: not in its row" for o in sorted(actual[command] - documented[command])]
        problems += [
            f"testbed {command} {o}: in its row, not an option" for o in sorted(documented[command] - actual[command])
        ]
    return problems


def test_the_readme_command_table_has_every_command_and_option():
    assert command_problems(build_parser(), README.read_text(encoding="utf-8")) == []


def test_the_command_check_finds_a_missing_command_a_ghost_and_a_missing_option():
    parser = argparse.ArgumentParser(prog="testbed")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("run")
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--seed")
    sub.add_parser("check")
    p = sub.add_parser("runs")
    p.add_argument("--tag")
    p.add_subparsers().add_parser("tag")
    text = (
        "<!-- commands -->\n| command | what |\n|---|---|\n"
        "| `testbed run PLAYBOOK [--emulate] [--wait]` | run it |\n"
        "| `testbed runner RUN_DIR` | gone |\n"
        "| `testbed runs [SELECTION]`, `testbed runs tag RUN NAME` | list, tag |\n"
        "\nSELECTION is `--tag NAME`.\n\nExit codes.\n"
    )
    assert command_problems(parser, text) == [
        "testbed runner: in the README's table, not a command",
        "testbed check: a command, not in the README's table",
        "testbed run --seed: not in its row",
        "testbed run --wait: in its row, not an option",
    ]
