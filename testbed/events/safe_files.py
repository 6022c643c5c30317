"""Reading and writing a run folder's files as untrusted input (docs/run-folders.md, "Files").

A run folder may come from anyone who can write the results folder: a colleague's archive, a shared (1777)
folder, a planted copy. So every reader and writer of its files goes through here, by these rules:
- a file is opened without following a symbolic link (O_NOFOLLOW), so a link planted in the folder never leads
  a read out of it (a root-only file) nor a write onto another file;
- only a regular file is read or appended to: a FIFO, a device or a socket is refused at once (opened
  O_NONBLOCK, so a FIFO with no writer cannot block the open, then checked with fstat);
- a file larger than its limit is refused before it is read, naming the file and the limit; JSONL files are
  read line by line, each line within a limit, so memory stays bounded by the records kept;
- JSON nested deeper than MAX_JSON_DEPTH is refused (as testbed.config refuses YAML), never a RecursionError;
- a file is written whole or not at all: into a temporary file created exclusively (O_EXCL, O_NOFOLLOW, a
  random name) in the destination's folder, then renamed over the target (a rename replaces a planted link
  itself and writes nothing through it).
A secret (the server's tokens file, a user's token) is read by the same rules, and only from a file this account
owns and alone may read and write (read_private).
Every refusal is an UnsafeFile, a UserError: the command line prints it and exits 2.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from testbed.contracts.errors import UserError

MAX_JSON_BYTES = 64 << 20  # run.json (with its inventory and playbook), summary.json: a large one is a few MB
MAX_JSONL_BYTES = 16 << 30  # events.jsonl, audit.jsonl: a long soak's history; a larger one is not a run's
MAX_LINE_BYTES = 16 << 20  # one event or audit record (a device's reply included)
MAX_FIGURE_BYTES = 32 << 20  # a PNG embedded in a report
MAX_JSON_DEPTH = 64  # objects and lists inside each other; a run's records nest a handful deep
_CHUNK = 1 << 20
_HOLDS_FILES = "refused (a run folder holds files)"  # what a refusal of a run folder's file says after its reason


class UnsafeFile(UserError):
    """A file that is refused (a run folder's, or a secret's): a link, not a regular file, too large, nested too
    deep; a secret's also when others may read or write it or another account owns it.
    """


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_fd(path: Path, flags: int, mode: int = 0o644, *, limit: int | None = None, rule: str | None = None) -> int:
    """A descriptor of `path`, a regular file, opened with `flags` without following a link; UnsafeFile if it
    is a link, anything but a regular file, or (with `limit`) larger than `limit` bytes. FileNotFoundError and
    other OSErrors of the open itself pass through for the caller to say what a missing file means. `rule`: what
    a refusal says after its reason (by default, a run folder's rules).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name is a symbolic link
            why = rule or "a run folder's files are read and written only as regular files in it, never through a link"
            raise UnsafeFile(f"{path}: a symbolic link ({_link_target(path)}); {why}") from None
        if exc.errno == errno.EISDIR:  # opened to write
            raise UnsafeFile(f"{path}: a folder, not a regular file; {rule or _HOLDS_FILES}") from None
        if exc.errno == errno.ENXIO:  # opened to write, O_NONBLOCK: a FIFO without a reader, or a device without one
            raise UnsafeFile(f"{path}: a FIFO or a device, not a regular file; {rule or _HOLDS_FILES}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path}: {_kind(st.st_mode)}, not a regular file; {rule or _HOLDS_FILES}")
        if limit is not None and st.st_size > limit:
            why = "; not a file a run writes" if rule is None else ""
            raise UnsafeFile(f"{path}: {st.st_size} bytes, over the limit of {limit} bytes for this file{why}")
        os.set_blocking(fd, True)  # a regular file: reads and writes as usual
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_target(path: Path) -> str:
    try:
        return f"to {os.readlink(path)}"
    except OSError:
        return "its target unread"


# --- reading ---------------------------------------------------------------------------------------------------


def read_bytes(path: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole of a regular file of at most `limit` bytes (a file that grows past it while read is refused too)."""
    fd = open_fd(path, os.O_RDONLY, limit=limit)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path}: over the limit of {limit} bytes for this file; not a file a run writes")
    return data


def read_private(path: Path, limit: int) -> bytes:
    """A secret's bytes (a tokens file, a user's token), refused (UnsafeFile) unless `path` is a regular file, not
    a link, of at most `limit` bytes, owned by this account and readable and writable by it alone: a secret others
    can read is no longer one, and a tokens file others can write lets them add a token of their own. Checked on
    the descriptor that is read, so what is read is what was checked. FileNotFoundError passes through.
    """
    fd = open_fd(path, os.O_RDONLY, limit=limit, rule="a secret is read only from the file itself")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            me = account(os.geteuid())
            raise UnsafeFile(f"{path}: owned by {account(st.st_uid)}, not by this account ({me}); chown it to {me}")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise UnsafeFile(f"{path}: others may read or write it (mode {mode:04o}); chmod 600 it")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read: refused, not cut short (a token past the cut would be lost unsaid)
        raise UnsafeFile(f"{path}: over the limit of {limit} bytes for this file")
    return data


def read_text(path: Path, limit: int = MAX_JSON_BYTES) -> str:
    try:
        return read_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeFile(f"{path}: not UTF-8 text ({exc})") from None


def loads(text: str | bytes, where: str) -> Any:
    """JSON, nested at most MAX_JSON_DEPTH deep; UnsafeFile naming `where` otherwise (or if it is not JSON)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep(where) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsafeFile(f"{where}: not JSON ({exc})") from None
    if nested_too_deep(value, text):
        raise too_deep(where)
    return value


def too_deep(where: str) -> UnsafeFile:
    return UnsafeFile(f"{where}: JSON nested more than {MAX_JSON_DEPTH} deep: not a file a run writes")


def nested_too_deep(value: Any, text: str | bytes | None = None) -> bool:
    """Whether a value loaded from JSON nests deeper than MAX_JSON_DEPTH. Given the text it was loaded from, the
    value is walked only if the text has more opening brackets than that: it cannot nest deeper than it has brackets
    (a catalog's sync reads every line of every run: docs/tuning.md, "The catalog").
    """
    if text is not None and _brackets(text) <= MAX_JSON_DEPTH:
        return False
    return _depth_over(value, MAX_JSON_DEPTH)


def _brackets(text: str | bytes) -> int:
    """How many `{` and `[` the text holds, in strings or not: at least as many as its containers."""
    if isinstance(text, str):
        return text.count("{") + text.count("[")
    return text.count(b"{") + text.count(b"[")


def _depth_over(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep (walked without recursion)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Iterable = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        todo.extend((child, depth + 1) for child in children)
    return False


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file by the rules above (a link, a FIFO, too large, too deep: UnsafeFile)."""
    return loads(read_bytes(path, limit), str(path))


def read_json_object(path: Path, limit: int = MAX_JSON_BYTES) -> dict:
    value = read_json(path, limit)
    if not isinstance(value, dict):
        raise UnsafeFile(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


def iter_lines(path: Path, limit: int = MAX_JSONL_BYTES, line_limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a file, each with its newline (the last one without, if the file does not end with one), read
    one at a time by the file's own buffered readline: memory holds one line at a time. A line longer than
    `line_limit` is refused (a 6 GB file of zeros is one such line), as is a file larger than `limit`.
    """
    fd = open_fd(path, os.O_RDONLY, limit=limit)
    with os.fdopen(fd, "rb", buffering=_CHUNK) as f:
        number = 1
        while line := f.readline(line_limit + 1):
            if len(line) - line.endswith(b"\n") > line_limit:  # its content, without the newline
                raise UnsafeFile(
                    f"{path}:{number}: a line over the limit of {line_limit} bytes; not a line a run writes"
                )
            yield line
            number += 1


# --- writing ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "wb", **open_args) -> Iterator[IO]:
    """A file object to write `path` with: a new file of a random name beside it, created exclusively and without
    following a link, renamed over `path` when the block ends without an error (removed if it raises).
    """
    path = Path(path)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
        os.replace(aside, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(aside)
        raise


def write_atomic(path: Path, data: bytes | str) -> None:
    """`path` written whole or not at all (see atomic_writer)."""
    with atomic_writer(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def open_append(path: Path) -> int:
    """A descriptor to append to a regular file (created if missing), never through a link."""
    return open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def append(path: Path, data: bytes) -> None:
    fd = open_append(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# --- whose folder ----------------------------------------------------------------------------------------------


def owner(path: Path) -> str | None:
    """The account that owns `path` when it is not the invoking user (by name, else uid); None when it is ours."""
    uid = os.stat(path).st_uid
    return None if uid == os.geteuid() else account(uid)


def account(uid: int) -> str:
    """The account's name, or `uid N` where it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def writable_by_us(folder: Path) -> bool:
    """Whether commands that read a folder may also write into it: it is ours, and we can write it."""
    try:
        return owner(folder) is None and os.access(folder, os.W_OK)
    except OSError:
        return False
