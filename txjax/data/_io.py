"""File plumbing shared by the data modules: where data lives, verified downloads.

Nothing here knows about MNIST or text. Every write is atomic (a temporary file in
the destination folder, then `os.replace`), so an interrupted or corrupt transfer
never leaves a half-written file where a loader would later trust it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from txjax import paths

__all__ = [
    "DATA_ENV",
    "cache_dir",
    "data_dir",
    "download",
    "sha256_file",
    "atomic_path",
]

DATA_ENV = "TXJAX_DATA"
"""Environment variable naming a folder that holds datasets (checked before the cache)."""


def data_dir() -> Path | None:
    """The folder named by `$TXJAX_DATA`, or None when the variable is unset or empty."""
    value = os.environ.get(DATA_ENV, "").strip()
    return Path(value).expanduser() if value else None


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The user cache folder: `override`, else `$XDG_CACHE_HOME/txjax`, else `~/.cache/txjax`.

    The folder is not created here; writers create it when they first need it.
    """
    if override is not None:
        return Path(override).expanduser()
    return paths.cache_dir()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks so large files need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success move it onto `dest`, on error delete it.

    Why: a reader must never find a truncated file under the final name.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a cache file should read like any other
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download(url: str, dest: str | os.PathLike, sha256: str | None, timeout: float = 5.0) -> Path:
    """Fetch `url` into `dest`, checking its SHA-256 before the file takes its final name.

    Raises `OSError` (network trouble, including `urllib.error.URLError`) or `ValueError`
    (checksum mismatch). In either case nothing is left at `dest` or beside it.
    `timeout` bounds each blocking socket operation, so an unreachable mirror fails fast.
    """
    dest = Path(dest)
    with atomic_path(dest) as tmp:
        digest = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            for block in iter(lambda: response.read(1 << 16), b""):
                digest.update(block)
                out.write(block)
        got = digest.hexdigest()
        if sha256 is not None and got != sha256:
            raise ValueError(
                f"checksum mismatch for {url}: expected sha256 {sha256}, got {got} "
                "(corrupt or truncated download; nothing was kept)"
            )
    return dest


def describe_error(err: BaseException) -> str:
    """One short line for an error, used when a loader reports every place it tried."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        return f"{type(err).__name__}: {err.reason}"
    return f"{type(err).__name__}: {err}"
