"""The built-in commands of the emulated host's shell, by name: every command it runs that is not a job program.

Each is a function of its arguments and the command line's `Context` that returns (stdout, stderr, status); the
interpreter writes that where the command's redirections say. One that streams (`tail -f`) writes to the
context's outputs as it goes.
"""

from __future__ import annotations

from emulators.gpuhost.shell.builtins import control, files, grep, host, logs, processes, tail
from emulators.gpuhost.shell.context import Builtin

BUILTINS: dict[str, Builtin] = {
    "nvidia-smi": host.nvidia_smi,
    "dmesg": logs.dmesg,
    "journalctl": logs.journalctl,
    "kill": processes.kill,
    "ps": processes.ps,
    "pgrep": processes.pgrep,
    "cat": files.cat,
    "tail": tail.tail,
    "ls": files.ls,
    "mkdir": files.mkdir,
    "cd": files.cd,
    "echo": control.echo,
    "true": control.true,
    "false": control.false,
    "hostname": host.hostname,
    "whoami": host.whoami,
    "pwd": files.pwd,
    "exit": control.exit_,
    "grep": grep.grep,
    "sleep": control.sleep,
}

__all__ = ["BUILTINS"]
