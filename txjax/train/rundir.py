"""A run folder: created and checked early, claimed by one run at a time, emptied only when claimed.

`prepare_run_dir` only creates and probes the folder, so a script can fail on an unwritable
path before it loads any data; `claim_run_dir` (what `train_run` does once the inputs are
loaded) takes the folder's lock and, with overwrite, only then empties it, so a bad input
never costs the old run's files and a second run in the same folder is refused.

A run of several processes (txjax.train.multihost) shares one folder: `claim_shared_run_dir`
lets process 0 take the lock and empty it, and the others go on only once it has.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from txjax.train.multihost import lead_decides

LOCK = ".lock"  # holds the pid of the run that owns the folder; locked with flock while it runs


class RunDirError(OSError):
    """The run folder cannot be created or written, or another run holds it."""


def prepare_run_dir(path: str | os.PathLike) -> Path:
    """Create `path` if needed and check it is writable; nothing in it is touched."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test.{socket.gethostname()}.{os.getpid()}"  # several processes may probe at once
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise RunDirError(f"cannot write to the run folder {path}: {err.strerror or err}") from err
    return path


def _empty(path: Path) -> None:
    """Remove everything in `path` but the lock file (whose inode the lock lives on)."""
    for entry in path.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextlib.contextmanager
def claim_run_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Hold the run folder for one run: an exclusive `flock` on `path/.lock` (released when the
    run ends, or its process dies), then, with overwrite, its old contents removed."""
    path = prepare_run_dir(path)
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunDirError(f"the run folder {path} is in use by another run (pid {owner}); wait for it to "
                              "finish, or pass another --name") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if overwrite:
            _empty(path)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def claim_shared_run_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """`claim_run_dir` for a run of one or more processes: process 0 holds the claim; every process
    returns from here once it has (or raises the RunDirError it met)."""
    with contextlib.ExitStack() as held:
        lead_decides(lambda: str(held.enter_context(claim_run_dir(path, overwrite))), errors=(RunDirError,))
        yield Path(path)
