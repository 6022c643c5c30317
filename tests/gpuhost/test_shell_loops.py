"""What the failure watch's command line needs of the emulated host's shell (emulators/gpuhost/shell/), as bash
and GNU tools on Linux do it: `while LIST ; do LIST ; done` (in the foreground, and in the background as a
subshell whose pid `$!` is, which `tail --pid` follows and `kill` ends), grep's statuses, sleep, and a job's
/proc/PID/stat.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.gpuhost.watch import ALIVE
from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.shell import Shell, Stream
from emulators.gpuhost.shell.syntax import ShellSyntaxError, parse_line
from emulators.gpuhost.spec import GpuHostSpec


@pytest.fixture
def sh(tmp_path) -> Iterator[Shell]:
    home = tmp_path / "home"
    home.mkdir()
    engine = GpuHostEngine(GpuHostSpec("gpu07", gpus=2, user="lab", jobs=("sleep",)), home)
    yield Shell(engine)
    engine.close()


def home(sh: Shell) -> Path:
    return sh.engine.home


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("while true ; do ; done", "unexpected token `;'"),
        ("while ; do true ; done", "unexpected token `;'"),
        ("while true do true ; done", "unexpected token `done'"),
        ("while true ; do true", "unexpected end of file"),
        ("while true ; do true ; done x", "unexpected token `x'"),
        ("while true ; do true ; done > f", "a loop's redirection `>' is not supported"),
        ("do true", "unexpected token `do'"),
    ],
)
def test_a_malformed_loop_is_refused_as_bash_refuses_it(line, message):
    with pytest.raises(ShellSyntaxError, match=message):
        parse_line(line)


def test_reserved_words_count_only_where_a_command_begins(sh):
    assert sh.run("echo while do done") == ("while do done\n", "", 0)


def test_a_loop_runs_its_body_while_its_condition_succeeds(sh):
    (home(sh) / "f").write_text("go\n")
    # The body's last command makes the condition fail: one round, and the loop's status is the body's.
    assert sh.run("while grep -q go f ; do echo round ; echo stop > f ; done ; echo $?") == ("round\n0\n", "", 0)
    assert sh.run("while false ; do echo never ; done ; echo $?") == ("0\n", "", 0)
    assert sh.run("while true ; do exit 3 ; done ; echo never") == ("", "", 3)


def test_grep_says_by_its_status_whether_a_line_matched_or_a_file_could_not_be_read(sh):
    (home(sh) / "f").write_text("step 1 (x)\nloss 2\n")
    assert sh.run("grep step f") == ("step 1 (x)\n", "", 0)
    assert sh.run("grep -c -E 'step|loss' f") == ("2\n", "", 0)
    assert sh.run("grep -v step f") == ("loss 2\n", "", 0)
    assert sh.run("grep '(x)' f") == ("step 1 (x)\n", "", 0)  # a BRE's ( is a character
    assert sh.run("grep -E '\\(x\\)$' f") == ("step 1 (x)\n", "", 0)
    assert sh.run("grep -q nothing f") == ("", "", 1)
    assert sh.run("grep -q step nope") == ("", "grep: nope: No such file or directory\n", 2)
    assert sh.run("grep -sq step nope") == ("", "", 2)
    assert sh.run("grep -q step nope f") == ("", "grep: nope: No such file or directory\n", 0)  # -q: a match wins
    assert sh.run("grep -q step ../f") == ("", "grep: ../f: Permission denied\n", 2)
    assert sh.run("grep -E '(' f")[2] == 2
    assert sh.run("grep -% x f")[1:] == (
        "grep: invalid option -- '%'\nUsage: grep [OPTION]... PATTERNS [FILE]...\nTry 'grep --help' for more "
        "information.\n",
        2,
    )


def test_sleep_takes_gnu_intervals_and_refuses_others(sh):
    assert sh.run("sleep 0.01 0.01s 5e-3") == ("", "", 0)  # a heartbeat written with %g may be 5e-05
    assert sh.run("sleep") == ("", "sleep: missing operand\nTry 'sleep --help' for more information.\n", 1)
    assert sh.run("sleep 1x")[1:] == (
        "sleep: invalid time interval '1x'\nTry 'sleep --help' for more information.\n",
        1,
    )


@pytest.mark.timeout(60)
def test_a_jobs_proc_stat_is_the_kernels_and_another_pids_is_missing(sh):
    pid = int(sh.run("sleep 60 > out.log 2>&1 & echo $!")[0])
    stat = sh.run(f"cat /proc/{pid}/stat")[0]
    assert stat.startswith(f"{pid} (sleep) ")
    assert sh.run(f"grep -sqE '{ALIVE}' /proc/{pid}/stat") == ("", "", 0)
    assert sh.run("cat /proc/1/stat") == ("", "cat: /proc/1/stat: No such file or directory\n", 1)
    sh.run(f"kill -KILL {pid}")
    assert sh.engine.jobs[pid].proc.wait(10) == -signal.SIGKILL
    assert sh.run(f"grep -sqE '{ALIVE}' /proc/{pid}/stat") == ("", "", 2)


@pytest.mark.timeout(60)
def test_a_background_loop_is_a_subshell_that_tail_pid_follows_until_it_ends(sh):
    (home(sh) / "f").write_text("go\n")
    out, err, rc = sh.run("while grep -q go f ; do sleep 0.01 ; done & echo $!")
    assert (err, rc) == ("", 0)
    loop = int(out)
    assert sh.run(f"cat /proc/{loop}/stat")[2] == 0  # a process of the host while it runs
    (home(sh) / "f").write_text("stop\n")
    # tail --pid returns (after a last read) only once the loop has ended.
    assert sh.run(f"tail -n +1 -s 0.01 --pid {loop} -F f") == ("stop\n", "", 0)
    assert sh.run(f"cat /proc/{loop}/stat")[2] == 1


@pytest.mark.timeout(60)
def test_kill_ends_a_background_loop(sh):
    (home(sh) / "f").write_text("go\n")
    loop = int(sh.run("while grep -q go f ; do sleep 0.01 ; done & echo $!")[0])
    assert sh.run(f"kill -CONT {loop}") == ("", "", 0)  # ignored, as bash's subshell ignores it
    assert sh.run(f"kill {loop}") == ("", "", 0)
    assert sh.run(f"tail -n 0 -s 0.01 --pid {loop} -F f") == ("", "", 0)


def test_sleep_in_the_background_is_a_job_of_the_allowlist(sh):
    pid = int(sh.run("sleep 60 & echo $!")[0])
    assert sh.run(f"ps -o args= -p {pid}") == ("sleep 60\n", "", 0)
    sh.run(f"kill -KILL {pid}")


@pytest.mark.parametrize(
    ("line", "message"),
    [  # what bash says of each
        ("{ echo a }", "unexpected end of file"),
        ("{ ; }", "unexpected token `;'"),
        ("}", "unexpected token `}'"),
        ("{ echo a ; } x", "unexpected token `x'"),
        ("{ echo a ; } > f", "a group's redirection `>' is not supported"),
    ],
)
def test_a_malformed_group_is_refused_as_bash_refuses_it(line, message):
    with pytest.raises(ShellSyntaxError, match=message):
        parse_line(line)


def test_a_group_runs_its_list_and_braces_elsewhere_are_words(sh):
    assert sh.run("{ echo a ; echo b >&2 ; } ; echo $?") == ("a\n0\n", "b\n", 0)
    assert sh.run("{ false ; } || echo failed") == ("failed\n", "", 0)
    assert sh.run("echo { }") == ("{ }\n", "", 0)


@pytest.mark.timeout(60)
def test_a_background_group_writes_to_the_channel_before_tail_pid_of_it_returns(sh):
    """The failure watch's line: the loop's last word (on stderr) reaches the exec channel as the loop ends,
    before tail, following the group, reads the log a last time and the line ends.
    """
    (home(sh) / "ctl").write_text("go\n")
    (home(sh) / "log").write_text("")
    arrived: list[tuple[str, str]] = []
    line = (
        "{ while grep -q go ctl ; do sleep 0.01 ; done ; echo gone >&2 ; } & "
        "tail -n +1 -s 0.01 --pid $! -F log ; exit $?"
    )
    stream = Stream(lambda text: arrived.append(("out", text)), lambda text: arrived.append(("err", text)))
    done: list = []
    runner = threading.Thread(target=lambda: done.append(sh.run(line, stream)), daemon=True)
    runner.start()
    with open(home(sh) / "log", "a") as log:
        log.write("last words\n")
    (home(sh) / "ctl").write_text("stop\n")
    runner.join(30)
    assert done == [("", "", 0)]
    assert ("err", "gone\n") in arrived and "".join(t for k, t in arrived if k == "out") == "last words\n"
