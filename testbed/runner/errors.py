"""How the engine says a step did not succeed."""

from __future__ import annotations

from testbed.errors import ExperimentFailed


class StepFailed(ExperimentFailed):
    pass


class ActorDied(ExperimentFailed):
    """A device actor died during a call: the call's outcome is unknown. Not a StepFailed, so code that
    records a step's own failure (`fail`: certainly did not happen) lets it through; the trial loop
    closes whatever such code left open with `info`."""

    def __init__(self, devices: list[str], detail: str) -> None:
        self.devices = devices
        super().__init__(f"the actor of {', '.join(devices)} died during a call ({detail}); Ray restarts it")


def raise_failures(results) -> None:
    """StepFailed with every error among these results (None: a call not run after an earlier failure)."""
    failed = [r for r in results if r is None or r.status != "ok"]
    if failed:
        raise StepFailed(
            "\n".join((r.error or f"{r.device}: {r.procedure} failed") if r else "not run" for r in failed)
        )
