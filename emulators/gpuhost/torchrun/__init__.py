"""`torchrun` on an emulated GPU host: a stand-in for PyTorch's launcher (torch.distributed.run), which CI
does not have. The emulated shell runs it (`python -m emulators.gpuhost.torchrun`) when asked for `torchrun`
(emulators/gpuhost/host.py, LAUNCHERS).

What it does as torchrun does (torch/distributed/run.py; elastic/agent/server/api.py and
local_elastic_agent.py; elastic/rendezvous/static_tcp_rendezvous.py and dynamic_rendezvous.py):

- options (options.py): the subset in `SUPPORTED`, with their dash and underscore spellings, defaults from
  PET_<NAME> environment variables, and argparse's own errors (prefixes of option names, unknown options:
  exit 2). An option torchrun has that this stand-in does not is refused by name;
- rendezvous (rendezvous.py), every launcher waiting for all --nnodes of them within the rendezvous timeout
  (--rdzv-conf timeout= for static, join_timeout= for c10d; 600 s by default, as torchrun's), with the static
  and c10d backends' ways of ranking the nodes;
- a node's workers (workers.py) get consecutive global ranks after those of the nodes before it; each worker's
  environment is the launcher's own plus torchrun's variables, its arguments with ${local_rank} substituted;
- the workers are checked every --monitor-interval seconds (0.1): when one fails the others are stopped
  (SIGTERM, SIGKILL after 30 s) and it exits 1 with torchrun's failure summary; when all succeed it exits 0.
  SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on to the workers, and it exits 1 once they are gone (the
  SignalException torchrun dies of) (launcher.py).

Where it differs, on purpose:
- the workers stay in the launcher's process group (torchrun gives each a session of its own): the emulated
  host tracks the processes it started by process group, so what it does to the launcher's job (a lost GPU,
  power off, a stop) reaches the ranks, as losing the host would;
- started by an emulated host (TESTBED_EMULATED_PROGRAMS, set by the host, lists its job programs), it starts
  only those programs, by bare name with --no-python: the host runs nothing outside its allowlist;
- --max-restarts must be 0 (no re-rendezvous), --nnodes a fixed number and --nproc-per-node an integer.

With TESTBED_TWIN_TORCHRUN=real in its environment it hands the (checked) command line to PyTorch's own
launcher (`python -m torch.distributed.run`): a twin run with real PyTorch ranks.
"""

from emulators.gpuhost.torchrun.launcher import REAL_ENV, main, run
from emulators.gpuhost.torchrun.options import SUPPORTED, UNSUPPORTED, Config, parse_args
from emulators.gpuhost.torchrun.rendezvous import Assignment, RendezvousError, rendezvous
from emulators.gpuhost.torchrun.workers import ALLOWLIST_ENV, Worker, start_workers, stop_workers

__all__ = [
    "ALLOWLIST_ENV",
    "REAL_ENV",
    "SUPPORTED",
    "UNSUPPORTED",
    "Assignment",
    "Config",
    "RendezvousError",
    "Worker",
    "main",
    "parse_args",
    "rendezvous",
    "run",
    "start_workers",
    "stop_workers",
]
