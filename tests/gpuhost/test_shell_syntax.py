"""The emulated host's command-line syntax (emulators/gpuhost/shell/syntax.py): words and quotes as bash reads
them, a line cut at its operators (`&` putting a command in the background), and a simple command's
assignments, prefixes (setsid, nohup, env -C, exec) and redirections wherever they stand.
"""

from __future__ import annotations

import pytest

from emulators.gpuhost.shell.syntax import (
    Redirections,
    ShellSyntaxError,
    parse_line,
    parse_simple,
    tokens,
    words,
)


def test_quotes_and_escapes_make_one_word_and_are_removed():
    assert words("echo 'a b' \"c  d\" e\\ f\tg") == ["echo", "a b", "c  d", "e f", "g"]
    assert words("  nvidia-smi   -L \n") == ["nvidia-smi", "-L"]


def test_an_unclosed_quote_is_an_error():
    with pytest.raises(ValueError):
        words("echo 'a")


def test_a_semicolon_ending_a_word_separates_commands():
    assert tokens("echo a; echo b") == ["echo", "a", ";", "echo", "b"]
    assert tokens("true;") == ["true", ";"]


def test_a_line_is_cut_at_its_operators_and_an_ampersand_runs_in_the_background():
    segments = parse_line("sleep 5 > s.log & echo $! && false || echo no ; pwd")
    assert [(s.words, s.separator) for s in segments] == [
        (["sleep", "5", ">", "s.log"], "&"),
        (["echo", "$!"], "&&"),
        (["false"], "||"),
        (["echo", "no"], ";"),
        (["pwd"], None),
    ]
    assert [s.background for s in segments] == [True, False, False, False, False]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("&& true", "-c: line 1: syntax error near unexpected token `&&'"),
        ("true ; ; true", "-c: line 1: syntax error near unexpected token `;'"),
        ("echo 'open", "-c: line 1: syntax error: No closing quotation"),
        ("ps | grep x", "emulated host: `|' is not supported"),
        ("echo $( hostname )", "emulated host: `$(' is not supported"),
    ],
)
def test_what_bash_or_the_host_refuses_is_a_syntax_error_that_says_why(line, message):
    with pytest.raises(ShellSyntaxError) as refused:
        parse_line(line)
    assert str(refused.value) == message


def test_an_empty_line_has_no_commands():
    assert parse_line("   ") == []


def test_assignments_and_prefixes_come_off_the_front_of_a_simple_command():
    command = parse_simple(
        ["X=1", "Y=a=b", "setsid", "-f", "nohup", "env", "-C", "run", "Z=3", "testbed-train", "--steps", "W=4"]
    )
    assert command.assignments == {"X": "1", "Y": "a=b", "Z": "3"}
    assert command.chdir == "run"
    assert command.words == ["testbed-train", "--steps", "W=4"]  # after the name, NAME=VALUE is an argument
    assert parse_simple(["env", "--chdir=d", "exec", "sleep", "1"]).chdir == "d"
    assert parse_simple(["exec", "sleep", "1"]).words == ["sleep", "1"]


def test_redirections_are_taken_wherever_they_stand_with_or_without_a_space():
    command = parse_simple(["prog", ">", "out", "a", "2>>err", "<", "in", "b"])
    assert command.words == ["prog", "a", "b"]
    assert command.redirections == Redirections(stdout=("out", False), stderr=("err", True), stdin="in")
    assert parse_simple(["prog", ">>log", "2>&1"]).redirections == Redirections(
        stdout=("log", True), stderr_to_stdout=True
    )
    assert parse_simple(["prog", "&>", "all"]).redirections == Redirections(
        stdout=("all", False), stderr_to_stdout=True
    )
    assert parse_simple(["echo", "x", "1>&2"]).redirections == Redirections(stdout_to_stderr=True)


def test_a_word_that_only_starts_like_a_duplication_is_a_word():
    assert parse_simple(["echo", "2>&1x"]).words == ["echo", "2>&1x"]


def test_a_redirection_without_its_file_is_a_syntax_error():
    with pytest.raises(ShellSyntaxError, match="syntax error near unexpected token `newline'"):
        parse_simple(["echo", "hi", ">"])
