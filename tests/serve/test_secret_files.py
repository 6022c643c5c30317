"""A secret is read only from a plain file of this account's that only it may read and write: the server's tokens
file (`testbed serve --tokens`) and a user's own token (~/.config/testbed/token), one reader for both
(testbed.events.safe_files.read_private). Each refusal names the file and what to change; nothing is cut short.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.contracts.errors import UserError
from testbed.serve.client import MAX_TOKEN_BYTES, TOKEN_ENV, load_token, token_file
from testbed.serve.remote import MAX_TOKENS_BYTES, read_tokens

DIGEST = "sha256:" + "ab" * 32
ME = pwd.getpwuid(os.geteuid()).pw_name  # a tokens file names accounts of this machine


def _link(path: Path, limit: int) -> None:
    real = path.with_name("real")
    real.write_text(path.read_text())
    real.chmod(0o600)
    path.unlink()
    path.symlink_to(real)


def _fifo(path: Path, limit: int) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def _folder(path: Path, limit: int) -> None:
    path.unlink()
    path.mkdir(mode=0o700)


def _chmod(mode: int) -> Callable[[Path, int], None]:
    return lambda path, limit: path.chmod(mode)


def _grow(path: Path, limit: int) -> None:
    with path.open("a") as f:
        f.write("#" * limit + "\n")


def _other_owner(path: Path, limit: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving the file to another account needs root (CI runs as root)")
    os.chown(path, 1234, 1234)


# How a secret's file is spoiled, and what its refusal says ({limit}: the file's size limit).
REFUSALS = [
    pytest.param(_link, "a symbolic link (to ", id="link"),
    pytest.param(_fifo, "a FIFO, not a regular file", id="fifo"),
    pytest.param(_folder, "a folder, not a regular file", id="folder"),
    pytest.param(_chmod(0o644), "others may read or write it (mode 0644); chmod 600 it", id="group-reads"),
    pytest.param(_chmod(0o620), "others may read or write it (mode 0620); chmod 600 it", id="group-writes"),
    pytest.param(_chmod(0o604), "others may read or write it (mode 0604); chmod 600 it", id="others-read"),
    pytest.param(_grow, "over the limit of {limit} bytes", id="too-large"),
    pytest.param(_other_owner, "owned by uid 1234, not by this account", id="another-owner"),
]


@pytest.mark.parametrize("spoil, said", REFUSALS)
def test_a_tokens_file_that_is_not_a_private_plain_file_is_refused_naming_it(tmp_path, spoil, said):
    path = tmp_path / "tokens"
    path.write_text(f"{ME}: {DIGEST}\n")
    path.chmod(0o600)
    assert read_tokens(path) == {ME: DIGEST}  # the file as `testbed token new` writes it is read
    spoil(path, MAX_TOKENS_BYTES)
    with pytest.raises(UserError) as refused:
        read_tokens(path)
    said = said.format(limit=MAX_TOKENS_BYTES)
    assert str(refused.value).startswith(f"--tokens {path}: ") and said in str(refused.value)


@pytest.mark.parametrize("spoil, said", REFUSALS)
def test_a_users_token_file_that_is_not_a_private_plain_file_is_refused_naming_it(tmp_path, monkeypatch, spoil, said):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    path = token_file()
    path.parent.mkdir(parents=True)
    path.write_text("a-token\n")
    path.chmod(0o600)
    assert load_token() == "a-token"
    spoil(path, MAX_TOKEN_BYTES)
    with pytest.raises(UserError) as refused:
        load_token()
    said = said.format(limit=MAX_TOKEN_BYTES)
    assert str(refused.value).startswith(f"{path}: ") and said in str(refused.value)


def test_a_missing_token_file_says_where_a_token_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(UserError, match=f"set {TOKEN_ENV}, or put it in {token_file()} \\(mode 600\\)"):
        load_token()
    with pytest.raises(UserError, match=f"--tokens {tmp_path / 'tokens'}: no such file"):
        read_tokens(tmp_path / "tokens")
