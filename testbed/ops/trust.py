"""What `testbed heal` believes of a run folder before it acts on a lab from it (docs/run-folders.md).

A run folder is input, like a playbook: anyone who can write it can make it say anything. heal drives devices and
signals processes, often as root, so before it acts:
- the folder must be the invoking user's own and writable by no one else (`refuse_foreign_folder`);
- the lab is the one the user describes: the inventory comes from the user's inventory file, the one the run
  recorded (its path and sha256 in run.json) or the one given with `--inventory`, and its digest must match; the
  inventory in run.json (its addresses, interlocks, `password_env`) is never used (`user_inventory`);
- a process is signalled only if it is still the one the run recorded: its pid, its start time, its owner and the
  run's id all match (`process_problem`).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from pathlib import Path

from testbed.contracts.errors import UserError
from testbed.documents.inventory import Inventory

# The folder's entries heal reads or writes are at its top; more than this many problems are summarised.
SHOWN_PROBLEMS = 5


def account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # an account with no passwd entry: its uid is all there is to name it
        return f"uid {uid}"


def _writable_by(mode: int) -> str | None:
    others = [who for who, bit in (("its group", stat.S_IWGRP), ("every account", stat.S_IWOTH)) if mode & bit]
    return " and ".join(others) or None


def foreign_folder_problems(run_dir: Path) -> list[str]:
    """Why `run_dir` is not a folder only the invoking user could have written (an empty list when it is)."""
    me = os.geteuid()
    st = os.stat(run_dir)
    problems = []
    if st.st_uid != me:
        problems.append(f"the folder is owned by {account_name(st.st_uid)}, not by you ({account_name(me)})")
    if (who := _writable_by(st.st_mode)) is not None:
        problems.append(f"the folder is writable by {who}")
    parent = os.stat(Path(run_dir).resolve().parent)
    if _writable_by(parent.st_mode) and not parent.st_mode & stat.S_ISVTX:
        # Without the sticky bit, whoever can write the parent can replace the run folder between check and use.
        problems.append(f"its parent folder is writable by {_writable_by(parent.st_mode)} (and not sticky)")
    with os.scandir(run_dir) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            est = entry.stat(follow_symlinks=False)
            if est.st_uid != me:
                problems.append(f"{entry.name} is owned by {account_name(est.st_uid)}")
            elif not stat.S_ISLNK(est.st_mode) and (who := _writable_by(est.st_mode)) is not None:
                problems.append(f"{entry.name} is writable by {who}")
    return problems


def refuse_foreign_folder(run_dir: Path, command: str = "heal") -> None:
    """A UserError, before anything is read or written, unless `run_dir` is the invoking user's own folder and
    writable by no one else: `command` acts on the lab from what the folder says.
    """
    try:
        if not stat.S_ISDIR(os.stat(run_dir).st_mode):
            raise UserError(f"{run_dir}: not a folder; pass a run folder `testbed run` wrote")
        problems = foreign_folder_problems(run_dir)
    except OSError as exc:
        raise UserError(f"{run_dir}: cannot be read ({exc.strerror}); pass a run folder `testbed run` wrote") from None
    if not problems:
        return
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    if len(problems) > SHOWN_PROBLEMS:
        shown += f"; and {len(problems) - SHOWN_PROBLEMS} more"
    me = account_name(os.geteuid())
    raise UserError(
        f"{run_dir}: `testbed {command}` drives the lab and signals processes from what a run folder says, so it acts "
        f"only on a folder that you own and no one else can write, and this one is not: {shown}. If the run is "
        f"yours, make the folder yours alone (`chown -R {me} {run_dir}` and `chmod -R go-w {run_dir}`) after looking "
        f"at what is in it; if it is another's, let its owner run `testbed {command}`, or copy it to a folder of your "
        "own and heal the copy (the inventory is then yours: heal uses your inventory file, not the folder's)"
    )


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def user_inventory(run_dir: Path, info: dict, given: str | None) -> Inventory:
    """The lab as the user's own inventory file describes it: the one the run recorded (`inventory_source` in
    run.json: its path and sha256), or `given` (heal's --inventory); its digest must be the recorded one.
    """
    from testbed.documents import load_inventory

    source = info.get("inventory_source")
    source = source if isinstance(source, dict) else {}
    recorded_path, recorded_digest = source.get("path"), source.get("sha256")
    if given is not None:
        path = Path(given)
    elif isinstance(recorded_path, str) and recorded_path:
        path = Path(recorded_path)
        _refuse_foreign_inventory(path)
    else:
        raise UserError(
            f"{run_dir}/run.json records no inventory file (a run from before runs recorded one): pass the inventory "
            "the run used with `testbed heal RUN --inventory FILE`; heal drives the lab only as your inventory "
            "describes it, never as run.json does"
        )
    try:
        digest = file_sha256(path)
    except OSError as exc:
        raise UserError(
            f"{path}: the inventory {'given' if given else 'the run used'} cannot be read ({exc.strerror}); pass the "
            "inventory the run used with `--inventory FILE`"
        ) from None
    if isinstance(recorded_digest, str) and digest != recorded_digest:
        raise UserError(
            f"{path} is not the inventory the run used: its sha256 is {digest[:16]}..., the run recorded "
            f"{recorded_digest[:16]}... (the file changed since, or run.json names another); heal drives the lab "
            "only as the run's own inventory describes it: pass that file with `--inventory FILE`"
        )
    inventory = load_inventory(path).model
    if isinstance(recorded_digest, str) and file_sha256(path) != recorded_digest:
        raise UserError(f"{path} changed while heal read it; run heal again")
    return inventory


def _refuse_foreign_inventory(path: Path) -> None:
    """The recorded path came from run.json: the file it names is believed only if others cannot have written it."""
    try:
        st = os.stat(path)
    except OSError:
        return  # said when it is read
    writers = _writable_by(st.st_mode)
    if st.st_uid not in (os.geteuid(), 0) or writers is not None:
        whose = f"writable by {writers}" if writers else f"owned by {account_name(st.st_uid)}"
        raise UserError(
            f"{path}: the inventory run.json names is {whose}, so it may not be the lab as you describe it; pass "
            "your inventory with `--inventory FILE`"
        )
