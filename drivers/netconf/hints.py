"""What to try after a Polatis switch refused a NETCONF request: one hint per RFC 6241 error-tag, in the words of
the switch's optical-switch YANG (docs/protocols.md §7 and §7.10).
"""

from __future__ import annotations

from collections.abc import Callable

from drivers.errors import switch_ports_hint


def refusal_hint(
    tag: str,
    info: dict[str, str],
    path: str,
    *,
    revision: str | None,
    ports: Callable[[], str],
    lock_holder: Callable[[], str | None],
) -> str:
    """What to try after the switch refused an RPC with error-tag `tag` (its error-info `info`, error-path `path`).

    `revision` is the optical-switch revision the switch announced, `ports()` says which ports it has and
    `lock_holder()` asks it who holds the lock on running: only the refusals that need them call them.
    """
    if tag in ("invalid-value", "bad-element"):
        return ports()
    if tag == "in-use":
        return in_use_hint(info, path, lock_holder)
    if tag == "lock-denied":
        return lock_hint(info.get("session-id"))
    if tag == "data-missing":
        return "that circuit is not on the switch (read connections()); another client may have changed it"
    if tag == "data-exists":
        return "the circuit already exists; read connections()"
    if tag in ("unknown-element", "unknown-namespace", "missing-element", "bad-attribute", "missing-attribute"):
        return (
            f"the switch's optical-switch YANG (revision {revision or 'unknown'}) does not take this request; "
            "check its firmware against the driver (docs/protocols.md §7)"
        )
    if tag == "operation-not-supported":
        return "the switch does not support this operation; check its firmware and NETCONF capabilities"
    if tag == "too-big":
        return "the request is too large for the switch: change fewer circuits per call"
    return "see the switch's error message; nothing was changed by a refused edit-config"


def in_use_hint(info: dict[str, str], path: str, lock_holder: Callable[[], str | None]) -> str:
    """What to try after an in-use refusal.

    in-use says a port carries a circuit, or that running is locked (RFC 6241 §7.5, Appendix A: then with no
    error-info, so no session-id). Only an error that points at a pair or a port gets the circuit hint; one that
    names no port is a lock unless the switch shows otherwise (`lock_holder()` asks it): docs/protocols.md §7.10.
    """
    if "session-id" in info:
        return lock_hint(info["session-id"])
    if info.get("bad-element") in ("ingress", "egress", "pair", "pairs") or "cross-connects" in path:
        return "an egress port carries one circuit at a time: disconnect the circuit that holds it first"
    holder = lock_holder()
    if holder is not None:
        return lock_hint(holder)
    return (
        "the switch says something is in use but names no port and no session, and running was not locked when "
        "the driver checked (a lock may have ended since): read connections(), then retry"
    )


def port_hint(size: tuple[int, int] | None, ask: Callable[[], tuple[int, int]]) -> str:
    """What to try after a port was refused: the ports the switch has (`size`, else `ask()` once)."""
    return (
        switch_ports_hint(size, ask)
        or "a port number is outside the switch; its product-information gives its NxM size"
    )


def lock_hint(session_id: str | None) -> str:
    """What to try when running is locked by the session `session_id` (0: outside NETCONF; None or ?: unnamed)."""
    if session_id == "0":
        holder = "someone outside NETCONF (the switch's CLI, TL1 or web interface)"
    elif session_id and session_id != "?":
        holder = f"NETCONF session {session_id}"
    else:
        holder = "another NETCONF session (the switch did not say which)"
    return f"running is locked by {holder}: wait for it to unlock, or end that session, then retry"
