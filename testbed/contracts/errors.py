"""Errors that reach the user, and the exit codes they map to.

Exit codes are part of the CLI contract: 0 success, 1 experiment failed, 2 bad input.
"""

from __future__ import annotations

from collections.abc import Iterable

from testbed.contracts.outcome import Outcome

EXIT_OK = 0
EXIT_EXPERIMENT_FAILED = 1
EXIT_BAD_INPUT = 2


class UserError(Exception):
    """A mistake in the user's input (files, options). Printed without a traceback; exit code 2."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(UserError):
    """One or more problems in a YAML file, each located at file:line and a key path."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class ConfigProblem:
    """One problem in a YAML file: where it is (file, line, key path) and what is wrong."""

    def __init__(self, file: str, line: int | None, key: str, message: str) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.message = message

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class ExperimentFailed(Exception):
    """The experiment ran but did not succeed (a device refused, a check failed). Exit code 1."""

    exit_code = EXIT_EXPERIMENT_FAILED


class StepFailed(ExperimentFailed):
    """A step of the experiment did not succeed (how the engine and the steps say so)."""


class ActorDied(ExperimentFailed):
    """A device actor died during a call: the call's outcome is unknown. Not a StepFailed, so code that
    records a step's own failure (`fail`: certainly did not happen) lets it through; the trial loop
    closes whatever such code left open with `info`.
    """

    def __init__(self, devices: list[str], detail: str) -> None:
        self.devices = devices
        super().__init__(f"the actor of {', '.join(devices)} died during a call ({detail}); Ray restarts it")


class OutcomeUnknown(StepFailed):
    """A step did not succeed, and one of its device operations may or may not have happened (an `info`
    outcome: a timeout after a write, a lost actor).
    """


def raise_failures(results: Iterable[Outcome | None]) -> None:
    """StepFailed with every error among these results (None: a call not run after an earlier failure);
    OutcomeUnknown when one of them may have happened all the same.
    """
    failed = [r for r in results if r is None or r.status != "ok"]
    if failed:
        text = "\n".join((r.error or f"{r.device}: {r.procedure} failed") if r else "not run" for r in failed)
        unknown = any(r is not None and r.status == "info" for r in failed)
        raise (OutcomeUnknown if unknown else StepFailed)(text)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the step's faults are healed, teardown runs, the fabric is read back."""


def interruption(exc: KeyboardInterrupt) -> str:
    """What stopped a run, in the words its events and summary use: an interruption raised with words of its own
    (testbed serve's cancel: "cancelled by alice") says them.
    """
    if exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
