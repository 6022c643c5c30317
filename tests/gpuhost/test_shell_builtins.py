"""The emulated host's interpreter and built-ins (emulators/gpuhost/shell/): a command line run as bash runs it
(operators, `$?`, `$!`, `~`, exit), built-ins' output where its redirections send it, the home as the limit of
every path, the file, log and process built-ins, and a background job started, seen, and killed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators.gpuhost.host import GpuHostEngine
from emulators.gpuhost.shell import Shell, Stream
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


def test_operators_run_what_the_last_status_allows(sh):
    assert sh.run("false || echo yes && echo also; false && echo no") == ("yes\nalso\n", "", 1)
    assert sh.run("false; echo $?; true; echo $?") == ("1\n0\n", "", 0)


def test_exit_ends_the_line_with_its_status_as_a_byte(sh):
    assert sh.run("echo a; exit 300; echo never") == ("a\n", "", 44)
    assert sh.run("exit x") == ("", "bash: exit: x: numeric argument required\n", 2)


def test_a_syntax_error_runs_nothing(sh):
    assert sh.run("echo a > made; echo b |") == ("", "bash: emulated host: `|' is not supported\n", 2)
    assert not (home(sh) / "made").exists()


def test_what_follows_a_nul_byte_never_reaches_the_shell(sh):
    assert sh.run("echo a\0; echo b") == ("a\n", "", 0)


def test_builtin_output_goes_where_its_redirections_send_it(sh):
    assert sh.run("echo one > f; echo two >> f; cat f") == ("one\ntwo\n", "", 0)
    assert sh.run("ls nope 2> e; cat e") == ("ls: cannot access 'nope': No such file or directory\n", "", 0)
    assert sh.run("ls nope 2>&1") == ("ls: cannot access 'nope': No such file or directory\n", "", 2)
    assert sh.run("echo loud 1>&2") == ("", "loud\n", 0)
    assert sh.run("echo gone > /dev/null") == ("", "", 0)


def test_every_path_stays_inside_the_home(sh):
    assert sh.run("cat /etc/hostname") == ("", "cat: /etc/hostname: Permission denied\n", 1)
    assert sh.run("cd ..") == ("", "bash: cd: ..: Permission denied\n", 1)
    assert sh.run("echo x > ../outside") == ("", "bash: ../outside: Permission denied\n", 1)
    assert sh.run("mkdir ../d") == ("", "mkdir: cannot create directory '../d': Permission denied\n", 1)
    assert not (home(sh).parent / "outside").exists()


def test_cd_mkdir_pwd_and_ls_work_in_the_home_and_tilde_is_the_home(sh):
    out, err, rc = sh.run("mkdir -p a/b && cd a/b && pwd && echo x > f && ls ~/a/b && cd && pwd")
    assert (out, err, rc) == (f"{home(sh)}/a/b\nf\n{home(sh)}\n", "", 0)
    assert sh.run("pwd") == (f"{home(sh)}\n", "", 0)  # each command line starts in the home


def test_env_chdir_must_name_a_directory_of_the_home(sh):
    assert sh.run("env -C nowhere sleep 1") == (
        "",
        "env: cannot change directory to 'nowhere': No such file or directory\n",
        125,
    )


def test_an_unknown_command_is_not_found_and_no_path_runs(sh):
    assert sh.run("rm -rf x") == ("", "bash: rm: command not found\n", 127)
    assert sh.run("/bin/sleep 1") == ("", "bash: /bin/sleep: No such file or directory\n", 127)


def test_the_host_says_who_and_where_it_is(sh):
    assert sh.run("hostname; whoami") == ("gpu07\nlab\n", "", 0)
    out, _, rc = sh.run("nvidia-smi -L")
    assert rc == 0 and out.count("GPU ") == 2


def test_tail_prints_the_end_or_the_rest_of_a_file(sh):
    (home(sh) / "log").write_text("".join(f"{i}\n" for i in range(1, 16)))
    assert sh.run("tail log")[0] == "".join(f"{i}\n" for i in range(6, 16))
    assert sh.run("tail -n 2 log") == ("14\n15\n", "", 0)
    assert sh.run("tail -n +14 log") == ("14\n15\n", "", 0)
    assert sh.run("tail -3 log") == ("13\n14\n15\n", "", 0)
    assert sh.run("tail -c 3 log") == ("15\n", "", 0)
    assert sh.run("tail -x log") == ("", "tail: unrecognized option '-x'\nTry 'tail --help' for more information.\n", 1)
    assert sh.run("tail -n z log") == ("", "tail: invalid number of lines: 'z'\n", 1)


def test_tail_follow_with_the_pid_of_no_job_prints_the_file_and_ends(sh):
    (home(sh) / "log").write_text("a\nb\nc\n")
    out: list[str] = []
    err: list[str] = []
    assert sh.run("tail -n 2 -s 0.01 --pid=1 -F log", Stream(out.append, err.append)) == ("", "", 0)
    assert ("".join(out), "".join(err)) == ("b\nc\n", "")


def test_tail_follow_of_a_missing_file_without_retry_gives_up(sh):
    assert sh.run("tail -f nope") == (
        "",
        "tail: cannot open 'nope' for reading: No such file or directory\ntail: no files remaining\n",
        1,
    )


def test_the_kernel_log_is_read_by_dmesg_and_journalctl_k(sh):
    dmesg, _, rc = sh.run("dmesg")
    assert rc == 0 and "nvidia-nvlink: Nvlink Core is being initialized" in dmesg
    journal, _, _ = sh.run("journalctl -k")
    assert "gpu07 kernel: nvidia-nvlink: Nvlink Core is being initialized" in journal
    assert sh.run("journalctl") == ("-- No entries --\n", "", 0)


@pytest.mark.timeout(60)
def test_a_background_job_is_seen_by_ps_and_pgrep_and_killed_by_kill(sh):
    out, err, rc = sh.run("mkdir j && sleep 60 > j/out.log 2>&1 & echo $!")
    assert (err, rc) == ("", 0)
    pid = int(out)
    assert sh.run(f"ps -o pid=,args= -p {pid}")[0].split() == [str(pid), "sleep", "60"]
    assert sh.run("pgrep -l sle") == (f"{pid} sleep\n", "", 0)
    assert sh.run(f"kill -TERM {pid}") == ("", "", 0)
    assert sh.engine.jobs[pid].proc.wait(10) == -signal.SIGTERM
    assert sh.run(f"kill {pid}") == ("", f"bash: kill: ({pid}) - No such process\n", 1)
    assert sh.run(f"ps -p {pid}") == ("    PID TT   TIME CMD\n", "", 1)  # the header alone: no such job


def test_kill_refuses_a_process_that_is_not_the_hosts(sh):
    assert sh.run(f"kill {os.getpid()}") == ("", f"bash: kill: ({os.getpid()}) - Operation not permitted\n", 1)
    assert sh.run("kill -BOGUS 1") == ("", "bash: kill: BOGUS: invalid signal specification\n", 1)
    assert sh.run("kill")[2] == 2
