"""`--netns` on the control side (docs/netns.md): whether this machine can make the twin's network namespaces,
the tag a run's namespaces and links carry, and what a dead run left (for `testbed heal`).
"""

from __future__ import annotations

import importlib.util
import secrets

from emulators import netns as _netns
from testbed.contracts.errors import UserError

tag_of = _netns.tag_of


def refuse_without_privilege() -> None:
    """A UserError, before anything starts, when this process cannot make namespaces and links."""
    why = _netns.missing_privilege()
    if why is not None:
        raise UserError(
            f"--netns: {why}, and this process has neither: run it as root (sudo), or leave out --netns (the twin "
            "then serves every host on 127.0.0.1, the default)"
        )
    if importlib.util.find_spec("pyroute2") is None:
        raise UserError("--netns: the twin makes its namespaces and links with pyroute2: pip install 'testbed[netns]'")


def run_tag(run_id: str | None) -> str:
    """The tag of a run's namespaces and links: from its id (so heal finds them from run.json alone), or random
    for a twin no run owns.
    """
    return tag_of(run_id) if run_id else secrets.token_hex(_netns.TAG_LEN // 2)


def leftovers(tag: str) -> dict[str, list]:
    """What a run with this tag left on this machine: its namespaces, its links, the processes in them."""
    return _netns.leftovers(tag)


def remove(tag: str) -> list[str]:
    """End and remove what `leftovers(tag)` finds; returns what was done, as lines."""
    return _netns.remove(tag)
