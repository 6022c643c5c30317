"""testbed-straggle: the host-side agent that makes a rank a persistent straggler (host.straggle on a lab).

    testbed-straggle --pid PID --duty D --period-ms M

stops PID's process group (SIGSTOP) for D of every M milliseconds and continues it (SIGCONT) for the rest,
until it receives SIGTERM, SIGINT or SIGHUP, or the group is gone. Whichever way it ends (a signal, the target
gone, an error), it continues the group last, so it never leaves the rank stopped; only SIGKILL can stop it
without that, which is why the framework's heal sends SIGCONT to the group itself as well (docs/faults.md).

It runs on the host, started over SSH in the background, so the duty cycle is timed by the host's clock and
not across the network. It prints one line when it has stopped the group for the first time,
`testbed-straggle AGENT_PID started: ...` (the driver waits for it), and one when it ends.

The ending signals are blocked and taken synchronously (sigtimedwait is the agent's sleep): no handler
interrupts it between a SIGSTOP and the SIGCONT after it. Standard library only, imported in milliseconds.
Exit status: 0 when ended by a signal or because the target is gone, 1 when the target cannot be signalled,
2 for a usage error (or a target in the agent's own process group, which it would stop with itself).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

PROG = "testbed-straggle"
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction strictly between 0 and 1")
    return value


def _period(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of milliseconds")
    return value


def _pid(text: str) -> int:
    value = int(text)
    if value <= 1:  # 0 and 1 would name the agent's own group or init's
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id above 1")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Stop a process group for a fraction of every period (a persistent straggler).",
    )
    parser.add_argument("--pid", type=_pid, required=True, help="a process of the group to slow down")
    parser.add_argument("--duty", type=_fraction, required=True, help="fraction of each period it is stopped")
    parser.add_argument("--period-ms", type=_period, required=True, help="length of one stop/run cycle")
    return parser.parse_args(argv)


def _say(text: str) -> None:
    try:
        print(f"{PROG} {os.getpid()} {text}", flush=True)
    except OSError:  # nobody reads the output any more: the duty cycle does not depend on it
        pass


def _signal(pgid: int, sig: int) -> str | None:
    """Signal the group; None if done, else why not ("gone", or the error)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return "gone"
    except OSError as exc:
        return f"cannot signal it: {exc.strerror or exc}"
    return None


def _wait(until: float) -> str | None:
    """Sleep until the monotonic time `until`; the name of an ending signal if one came first."""
    while True:
        left = until - time.monotonic()
        info = signal.sigtimedwait(ENDING, max(left, 0.0))
        if info is not None:
            return signal.Signals(info.si_signo).name
        if left <= 0 or time.monotonic() >= until:
            return None


def straggle(pid: int, duty: float, period_s: float) -> int:
    """The duty cycle on pid's process group; the ending signals must be blocked already (main does it)."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        _say(f"cannot start: no process {pid}")
        return 1
    if pgid <= 1 or pgid == os.getpgid(0):
        _say(f"refused: process {pid} is in the agent's own process group {pgid} (start the agent with setsid)")
        return 2
    stopped_s, running_s = duty * period_s, (1.0 - duty) * period_s
    cycles, why = 0, None
    try:
        due = time.monotonic()
        while why is None:
            why = _signal(pgid, signal.SIGSTOP)
            if why is not None:
                break
            if cycles == 0:
                _say(f"started: process group {pgid} stopped {duty:g} of every {period_s * 1000:g} ms")
            due += stopped_s
            why = _wait(due)
            if why is not None:
                break
            why = _signal(pgid, signal.SIGCONT)
            if why is not None:
                break
            cycles += 1
            due += running_s
            # Behind by more than a period (the host was overloaded, or the agent itself was stopped): start
            # the next period now rather than catch up with a burst of short ones.
            due = max(due, time.monotonic() - period_s)
            why = _wait(due)
    finally:
        # Last, on every way out (an exception included): the group is left running.
        left = _signal(pgid, signal.SIGCONT)
        status = "continued" if left is None else left
        _say(f"ended ({why or 'error'}) after {cycles} cycle(s): process group {pgid} {status}")
    return 1 if why is not None and why.startswith("cannot") else 0


def main(argv: list[str] | None = None) -> int:
    # Before anything else: an ending signal from now on is taken by the duty cycle's own wait, never by a
    # handler that could cut in between a SIGSTOP and its SIGCONT. (Before this line nothing is stopped yet.)
    signal.pthread_sigmask(signal.SIG_BLOCK, ENDING)
    args = parse(argv)
    return straggle(args.pid, args.duty, args.period_ms / 1000.0)


if __name__ == "__main__":
    sys.exit(main())
