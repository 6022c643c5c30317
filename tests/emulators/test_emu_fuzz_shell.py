"""Property tests for the emulated GPU host's restricted shell (emulators/gpuhost/shell/): random and
malformed command lines (quotes, redirections, pipes, operators, long lines, control characters, NUL
bytes, non-ASCII digits) never make it raise, hang, run anything or touch a file outside the host's
home; every line ends with an exit status a real shell could give (0-255). Directly on Shell.run, and
through the host's real SSH server (exec channels).
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from drivers.errors import DeviceTimeout
from drivers.transports.ssh import SshSettings, SshTransport
from emulators.gpuhost.device import GpuHostAdapter
from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.shell import Shell, Stream
from emulators.gpuhost.shell.syntax import words as _words
from emulators.gpuhost.spec import GpuHostSpec

HANG_UP_S = 0.3  # the client of a fuzzed line hangs up after this (a `tail -f` runs until it does)
# "Never a hang" is not a wall-clock bound here: a line that runs on after its client hung up never returns, and
# pytest-timeout (pyproject.toml) fails the test; through SSH, the client's own timeout ends the call.

WORDS = [
    "nvidia-smi", "dmesg", "journalctl", "-k", "kill", "ps", "pgrep", "cat", "tail", "ls", "mkdir", "-p", "cd",
    "echo", "true", "false", "hostname", "whoami", "pwd", "exit", "sleep", "testbed-train", "bash", "rm",
    " ", "&&", "||", ";", "&", "|", "|&", "$(", "`", ">", ">>", "2>", "2>&1", "&>", "<", "1>&2", ">&2",
    "'", '"', "\\", "#", "a", "b/c", "..", "../..", "/", "/etc/passwd", "/dev/zero", "~", "~/x", "$!", "$HOME",
    "*", "-n", "5", "+1", "-f", "-F", "--pid=1", "-s", "0.01", "-o", "pid,stat", "stat=", "-p", "1", "-9", "--",
    "-1", "-0", "--query-gpu=index,name", "--format=csv", "-i", "X=1", "env", "-C", "setsid", "nohup", "exec",
    "\n", "\t", "\r", "\x00", "\x1b[31m", "é", "٣", "9" * 5000,
]  # fmt: skip

command_lines = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(WORDS), max_size=20).map(" ".join),
    st.lists(st.sampled_from(WORDS), max_size=20).map("".join),
)


@pytest.fixture(scope="module")
def shell() -> Iterator[tuple[Shell, Path]]:
    root = Path(tempfile.mkdtemp(prefix="fuzz-shell-"))
    home = root / "home"
    home.mkdir()
    engine = GpuHostEngine(GpuHostSpec("fuzz", gpus=2, jobs=()), home)  # jobs=(): nothing may be started
    yield Shell(engine), root
    engine.close()


def run(sh: Shell, line: str, hang_up: bool = False) -> tuple[str, str, int]:
    """(stdout, stderr, exit status): what an exec channel would carry, streamed or returned.

    With `hang_up`, the client goes away HANG_UP_S after the call (so a line that would run on ends) and
    whatever the shell had not yet flushed is lost, as for a real client; without it, the client reads to the
    end, so a check of what a line prints holds however slow the machine is.
    """
    out: list[str] = []
    err: list[str] = []
    stream = Stream(out=out.append, err=err.append)  # a client that reads to the end
    if hang_up:
        start = time.monotonic()
        stream.closed = lambda: time.monotonic() - start > HANG_UP_S
    rest_out, rest_err, status = sh.run(line, stream)  # must not raise
    return "".join(out) + rest_out, "".join(err) + rest_err, status


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines)
@example("cat a\x00b")  # os.path.realpath raised ValueError on the NUL byte
@example("echo hi > x\x00y")
@example("exit ²")  # int('²') raised
@example("exit 300")  # an exit status is a byte
@example("ps -p ²")
@example("echo " + "a" * 100_000)
def test_any_command_line_ends_cleanly_inside_the_home(shell, line):
    sh, root = shell
    out, err, status = run(sh, line, hang_up=True)  # returns at all: the client's hang-up ends what would run on
    assert isinstance(status, int) and 0 <= status <= 255
    assert "Traceback" not in err
    assert [p.name for p in root.iterdir()] == ["home"]  # nothing written outside the home
    assert not [j for j in sh.engine.live_jobs()]  # nothing was started


@pytest.mark.parametrize(
    ("line", "status", "words"),
    [
        ("echo 'unterminated", 2, "syntax error"),
        ('echo "unterminated', 2, "syntax error"),
        ("echo a \\", 2, "syntax error"),
        ("&& true", 2, "unexpected token `&&'"),
        ("; ;", 2, "unexpected token `;'"),
        ("ps | cat", 2, "`|' is not supported"),
        ("echo $( hostname )", 2, "`$(' is not supported"),
        ("echo >", 2, "unexpected token `newline'"),
        ("rm -rf ~", 127, "rm: command not found"),
        ("/bin/sh -c id", 127, "No such file or directory"),
        ("sleep 100 &", 127, "sleep: command not found"),  # a job, and not on this host's allowlist
        ("cat /etc/passwd", 1, "Permission denied"),
        ("cd ../..", 1, "Permission denied"),
        ("echo x > ../escape", 1, "Permission denied"),
        ("exit x", 2, "numeric argument required"),
        ("kill -NOPE 1", 1, "invalid signal specification"),
        ("ps -o bogus", 1, "unknown user-defined format specifier"),
        ("pgrep '('", 2, "invalid regular expression"),
    ],
)
def test_malformed_lines_get_a_clear_error(shell, line, status, words):
    sh, _ = shell
    out, err, got = run(sh, line)
    assert (got, words in err) == (status, True), (out, err)


def test_text_after_a_nul_byte_never_reaches_the_shell(shell):
    # sshd passes the command on as a C string, so a NUL ends it there.
    sh, _ = shell
    assert run(sh, "echo before\x00; echo after") == ("before\n", "", 0)


@pytest.mark.parametrize("line", ["tail -n ² x", "tail --pid=² -F x"])
def test_tail_with_a_non_ascii_digit_is_an_error_not_a_crash(shell, line):
    sh, _ = shell
    _, err, status = run(sh, line)
    assert status == 1 and "invalid" in err


# --- through the host's SSH server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssh_host() -> Iterator[SshTransport]:
    host = GpuHostAdapter(GpuHostSpec("fuzz", gpus=2, jobs=()))
    ep = host.start_sync()
    address, port = ep["ssh"].rsplit(":", 1)
    settings = SshSettings(address, ep["user"], int(port), ep["key_file"], ep["known_hosts"], timeout_s=2.0)
    transport = SshTransport(settings, "fuzz")
    yield transport
    transport.close()
    host.close_sync()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines)
@example("cat a\x00b")
@example("cat " + "9" * 5000)  # a name too long for the file system: once, no exit status at all
@example("kill " + "9" * 5000)  # a pid too long for int(): once, an internal error
def test_the_ssh_server_answers_every_line_with_an_exit_status(ssh_host, line):
    try:
        result = ssh_host.exec(line, timeout_s=1.0, check=False)
    except DeviceTimeout as exc:  # a `tail -f` runs until the client hangs up: the client's timeout ends it
        assert "within 1 s" in str(exc) or "within 2 s" in str(exc), exc  # the call's timeout or the transport's
        return
    assert 0 <= result.status <= 255
    assert "internal error" not in result.stderr  # what the server says when the shell raised


def test_the_ssh_server_is_still_serving(ssh_host):
    assert ssh_host.exec("hostname").stdout == "fuzz\n"


@given(st.text(alphabet=" \t\r\n\x0b\xa0ab;$?|&<>=-#'\"\\", max_size=40))
def test_words_are_split_as_shlex_splits_them(line):
    # _words skips shlex's character scan when there is nothing to unquote; it must agree with shlex
    try:
        expected = shlex.split(line, comments=False, posix=True)
    except ValueError:  # an unclosed quote: shlex's own error either way
        with pytest.raises(ValueError):
            _words(line)
        return
    assert _words(line) == expected


def test_a_command_lines_output_is_written_in_order_and_in_as_few_writes_as_it_comes(shell):
    # Quick commands reach the channel together (one SSH packet, as sshd would read the shell's pipe),
    # and stdout and stderr keep their order between them (with a pty they share one terminal).
    sh, _ = shell
    writes: list[tuple[str, str]] = []
    stream = Stream(out=lambda t: writes.append(("out", t)), err=lambda t: writes.append(("err", t)))
    assert sh.run("echo a; echo b; ls nope; echo c", stream) == ("", "", 0)
    assert writes == [
        ("out", "a\nb\n"),
        ("err", "ls: cannot access 'nope': No such file or directory\n"),
        ("out", "c\n"),
    ]
