"""Whose runs a selection holds: the kernel's owner of each run folder (the catalog's `owner_uid`), never the
`user` a run.json says, which whoever wrote the folder chose (docs/run-folders.md).

`--owner` takes a user name, `@GROUP` (its members, and the accounts whose primary group it is), a numeric uid, or
`anyone`. The commands that give a verdict over runs (gate, trend, report --across) select only the invoking
user's runs unless told otherwise, so a run folder another account drops into a shared results folder cannot change
what they say.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Iterable

from testbed.catalog.folder import MIXED_OWNERS
from testbed.contracts.errors import UserError

ANYONE = "anyone"


def mine() -> list[int]:
    """The invoking user's uid, as a selection's owners."""
    return [os.geteuid()]


def resolve_owners(values: Iterable[str]) -> list[int] | None:
    """The uids `--owner` values name; None for anyone. UserError naming a value that is no account or group."""
    uids: set[int] = set()
    for value in values:
        value = str(value).strip()
        if value == ANYONE:
            return None
        if value.startswith("@"):
            uids |= _group_members(value[1:])
        elif value.isdigit():
            uids.add(int(value))
        else:
            try:
                uids.add(pwd.getpwnam(value).pw_uid)
            except KeyError:
                raise UserError(
                    f"--owner {value!r}: no such account here; give a user name, @GROUP, a uid or {ANYONE}"
                ) from None
    return sorted(uids)


def owner_name(uid: int | None) -> str | None:
    """An owner as people read it: the account's name, else `uid N`; `mixed` for a folder of several owners."""
    if uid is None:
        return None
    if uid == MIXED_OWNERS:
        return "mixed"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_members(name: str) -> set[int]:
    try:
        group = grp.getgrnam(name)
    except KeyError:
        raise UserError(f"--owner @{name}: no such group here") from None
    members = set()
    for user in group.gr_mem:
        try:
            members.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            continue
    members |= {p.pw_uid for p in pwd.getpwall() if p.pw_gid == group.gr_gid}
    return members
