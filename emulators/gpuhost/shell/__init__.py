"""The restricted command language of an emulated GPU host: what an SSH exec channel may run.

A command line is simple commands (or `while LIST ; do LIST ; done` loops) joined by `&&`, `||`, `;` and `&`
(syntax.py). A simple command is
`[NAME=VALUE ...] [setsid|nohup|env [-C DIR] [NAME=VALUE ...]] WORD ARGS [> F | >> F | 2> F | 2>&1 | &> F | < F]`
and WORD is either a built-in (builtins/: nvidia-smi, dmesg, journalctl -k, kill, ps, pgrep, cat, tail, grep, ls,
mkdir, cd, echo, true, false, sleep, hostname, whoami, pwd, exit) or a job program on the host's allowlist, started as a
real child process (jobs.py). Nothing else runs (interpreter.py). Every path must resolve inside the host's
private home (context.py), but /proc/PID/stat of the host's own processes.

Output streams: given a `Stream` (an exec channel), what a command prints is sent as it is produced (a
foreground job's pipes, `tail -f` lines), not when the command line ends (output.py).
"""

from emulators.gpuhost.shell.interpreter import Shell
from emulators.gpuhost.shell.output import Stream

__all__ = ["Shell", "Stream"]
