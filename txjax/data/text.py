"""Text: corpora, and (re-exported from `txjax.data.text_tokenizers`) the tokenizers.

Corpora (`load_corpus`):
- `"default"` (or None): `corpora/shakespeare_excerpt.txt`, shipped inside the package
  (package data, ~100 KB): the first 99,843 characters of tiny shakespeare, cut at a
  blank line. Works offline everywhere. Shakespeare's text is public domain; the
  selection and layout are from Karpathy's char-rnn (MIT licence).
- `"tinyshakespeare"`: the full 1,115,394-byte file (SHA-256 checked), found at
  `$TXJAX_DATA/tinyshakespeare.txt`, then the cache `~/.cache/txjax/tinyshakespeare.txt`,
  then downloaded from its canonical URL (short timeout) into the cache.
- any other string: a UTF-8 file path.

The character and BPE tokenizers and the per-family special-token layouts (`FAMILIES`)
live in `txjax.data.text_tokenizers`; every name there is importable from here too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from txjax.data._io import cache_dir, data_dir, describe_error, download, sha256_file
from txjax.data.text_tokenizers import (
    DEFAULT_T5_SENTINELS,
    FAMILIES,
    BPETokenizer,
    CharTokenizer,
    load_tokenizer,
    sentinel_token,
)

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "CORPORA",
    "DEFAULT_T5_SENTINELS",
    "FAMILIES",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URLS",
    "load_corpus",
    "load_tokenizer",
    "sentinel_token",
]

# --------------------------------------------------------------------------- corpora

TINY_SHAKESPEARE_URLS: tuple[str, ...] = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    "https://storage.googleapis.com/download.tensorflow.org/data/shakespeare.txt",
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DEFAULT_CORPUS_FILE = "shakespeare_excerpt.txt"
CORPORA = ("default", "tinyshakespeare")


def _read_text(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text ({e})") from e
    if not text.strip():
        raise ValueError(f"{what} {path} is empty")
    return text


def _tinyshakespeare(cache: Path, download_ok: bool, urls: Sequence[str], sha256: str | None,
                     timeout: float) -> str:
    tried = []
    env = data_dir()
    if env is not None:
        p = env / "tinyshakespeare.txt"
        if p.is_file():
            return _read_text(p, "corpus")
        tried.append(f"{p}: not there")
    cached = cache / "tinyshakespeare.txt"
    if cached.is_file():
        if sha256 is None or sha256_file(cached) == sha256:
            return _read_text(cached, "corpus")
        cached.unlink()
        tried.append(f"{cached}: checksum mismatch, removed")
    else:
        tried.append(f"{cached}: not there")
    if download_ok:
        for url in urls:
            try:
                download(url, cached, sha256, timeout=timeout)
                return _read_text(cached, "corpus")
            except (OSError, ValueError) as e:
                tried.append(f"{url}: {describe_error(e)}")
    raise FileNotFoundError("tinyshakespeare not found; tried:\n  " + "\n  ".join(tried)
                            + "\nPut the file at $TXJAX_DATA/tinyshakespeare.txt.")


def load_corpus(
    name_or_path: str | os.PathLike | None = None,
    *,
    cache: str | os.PathLike | None = None,
    download: bool = True,
    urls: Sequence[str] = TINY_SHAKESPEARE_URLS,
    sha256: str | None = TINY_SHAKESPEARE_SHA256,
    timeout: float = 5.0,
) -> str:
    """Return a corpus as one string: "default", "tinyshakespeare", or a UTF-8 file path.

    Known names win over paths. Raises FileNotFoundError for a missing file or unknown
    name, ValueError for an empty or non-UTF-8 file. `urls`/`sha256` are the download
    sources for "tinyshakespeare" (tests point them at a local server).
    """
    name = "default" if name_or_path is None else name_or_path
    if isinstance(name, str) and name == "default":
        ref = resources.files("txjax.data").joinpath("corpora", DEFAULT_CORPUS_FILE)
        if not ref.is_file():
            raise FileNotFoundError(
                f"packaged corpus corpora/{DEFAULT_CORPUS_FILE} is missing from this install of "
                "txjax (the build must list it as package data)")
        text = ref.read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError("the packaged default corpus is empty")
        return text
    if isinstance(name, str) and name in ("tinyshakespeare", "tiny_shakespeare"):
        return _tinyshakespeare(cache_dir(cache), download, urls, sha256, timeout)
    p = Path(name).expanduser()
    if p.is_dir():
        raise ValueError(f"corpus path {p} is a folder, not a text file")
    if not p.is_file():
        raise FileNotFoundError(
            f"no corpus file {p} (and {str(name)!r} is not one of the names {CORPORA})")
    return _read_text(p, "corpus")
