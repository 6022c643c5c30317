"""Who is at the other end of the server's socket, and where the socket is.

A local client is who the kernel says it is: the uid of the process that connected (SO_PEERCRED), read from the
connection itself. Nothing a client sends names its user, so no client can speak for another account. The socket
of a lab's server has one place, derived from the inventory, so `testbed run` finds it without being told
(docs/serve.md).
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from testbed.contracts.errors import UserError

SERVE_DIR_ENV = "TESTBED_SERVE_DIR"  # the folder sockets are made and looked for in (tests, a second lab)
SYSTEM_DIR = Path("/run/testbed")  # root's servers: the lab's, for every account of the control host


@dataclass(frozen=True)
class Peer:
    """A connected client: its account and the process that connected (pid 0 and `remote` for a client identified by
    its token on the remote listener, testbed.serve.remote).
    """

    uid: int
    gid: int
    pid: int
    user: str
    remote: bool = False

    def may_manage(self, owner_uid: int, admins: Admins) -> bool:
        """Whether this client may cancel or move a run of `owner_uid`: its own, or as one of the lab's admins."""
        return self.uid == owner_uid or admins.includes(self)


@dataclass(frozen=True)
class Admins:
    """The lab's admins: root, the server's own account, and the members of `group` (a system group, if named)."""

    group: str | None = None

    def __str__(self) -> str:
        names = ["root"] + ([user_name(os.geteuid())] if os.geteuid() != 0 else [])
        return ", ".join(names + ([f"members of {self.group}"] if self.group else []))

    def includes(self, peer: Peer) -> bool:
        if peer.uid in (0, os.geteuid()):
            return True
        if self.group is None:
            return False
        try:
            entry = grp.getgrnam(self.group)
        except KeyError:
            return False  # checked at start; a group removed since admits nobody
        return peer.gid == entry.gr_gid or peer.user in entry.gr_mem


def user_name(uid: int) -> str:
    """The account's name, or its uid as text where it has none (an account with no passwd entry)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def peer_of(sock: socket.socket) -> Peer:
    """The account of the process at the other end of a connected Unix socket, as the kernel recorded it when it
    connected (SO_PEERCRED).
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(uid=uid, gid=gid, pid=pid, user=user_name(uid))


def socket_name(inventory_file: str | Path, emulate: bool) -> str:
    """The socket's file name for a lab (its inventory's file name) or for its twin: a server of each may run."""
    stem = Path(inventory_file).name.removesuffix(".yaml").removesuffix(".yml")
    return f"{stem}.twin.sock" if emulate else f"{stem}.sock"


def serve_dirs() -> list[Path]:
    """Where a client looks for a server, in order: $TESTBED_SERVE_DIR alone where it is set; else root's
    /run/testbed (a lab's shared server), then this account's own runtime folder.
    """
    given = os.environ.get(SERVE_DIR_ENV)
    if given:
        return [Path(given)]
    return [SYSTEM_DIR, own_dir()]


def own_dir() -> Path:
    """This account's folder for its servers: $XDG_RUNTIME_DIR/testbed (the session's, its account's alone), else
    /tmp/testbed-serve-UID.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "testbed" if runtime else Path(f"/tmp/testbed-serve-{os.geteuid()}")


def default_socket(inventory_file: str | Path, emulate: bool) -> Path:
    """Where `testbed serve` makes its socket: $TESTBED_SERVE_DIR; else /run/testbed as root; else own_dir()."""
    given = os.environ.get(SERVE_DIR_ENV)
    if given:
        folder = Path(given)
    elif os.geteuid() == 0:
        folder = SYSTEM_DIR
    else:
        folder = own_dir()
    return folder / socket_name(inventory_file, emulate)


def prepare_folder(folder: Path, *, shared: bool) -> None:
    """Make the socket's folder, or check the one there. A shared folder (root's /run/testbed, a test's) is 0755:
    every account may reach the socket in it, none but its owner may add, replace or remove a file; an account's
    own folder is 0700: its owner alone may connect. A folder another (non-root) account owns is refused: its owner
    could put a socket of its own in the server's place.
    """
    mode = 0o755 if shared else 0o700
    try:
        folder.mkdir(mode=mode, parents=True)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{folder}: not a folder; the server's socket needs one (docs/serve.md)")
    if st.st_uid not in (0, os.geteuid()):
        raise UserError(f"{folder}: owned by {user_name(st.st_uid)}, not by this account or root; use another folder")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UserError(f"{folder}: others may write in it; give the socket a folder only its owner writes (0755)")
