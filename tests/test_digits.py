"""The digit classifier that scores sampled MNIST digits: fit, cache, and the quality figures."""

import math

import numpy as np
import pytest

from experiment_scripts import SHARED_DATA
from txjax.tasks.digits import (CONFIDENT, DigitClassifierConfig, accuracy, cached_classifier, classify,
                                digit_quality, train_classifier)

SMALL = DigitClassifierConfig(hidden=32, epochs=5, batch_size=20, learning_rate=1e-2)
MNIST = SHARED_DATA / "mnist.npz"


def bars(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Class k is a bar on rows 2k..2k+2, plus a few random on-pixels: separable, not trivial."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = rng.random((n, 28, 28)) < 0.03
    for i, k in enumerate(y):
        x[i, 2 * k: 2 * k + 3, 4:24] = True
    return x, y


def test_a_separable_set_is_learned_and_scored_confident():
    x, y = bars(400)
    params = train_classifier(x, y, SMALL)
    xt, yt = bars(200, seed=1)
    assert accuracy(params, xt, yt) == 1.0
    probs = classify(params, xt)
    assert probs.shape == (200, 10) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    q = digit_quality(params, xt)
    assert q == {"confident_share": pytest.approx(float(np.mean(probs.max(axis=1) >= CONFIDENT))),
                 "classes": 10, "n": 200}
    assert q["confident_share"] > 0.9


def test_blank_images_are_one_class_at_most():
    x, y = bars(400)
    params = train_classifier(x, y, SMALL)
    q = digit_quality(params, np.zeros((50, 28, 28), bool))
    assert q["classes"] == 1 and q["n"] == 50


def test_the_cache_is_reused_and_a_damaged_one_is_trained_over(tmp_path):
    x, y = bars(200)
    lines = []
    first, path = cached_classifier(x, y, SMALL, cache=tmp_path, log=lines.append)
    assert path.parent == tmp_path and path.is_file() and len(lines) == 1
    again, same = cached_classifier(x, y, SMALL, cache=tmp_path, log=lines.append)
    assert same == path and len(lines) == 1  # loaded, not trained
    assert all(np.array_equal(first[k], again[k]) for k in first)
    other, other_path = cached_classifier(x, y, DigitClassifierConfig(hidden=16, epochs=1, batch_size=20),
                                          cache=tmp_path, log=lines.append)
    assert other_path != path  # the settings are part of the name
    path.write_bytes(b"not an npz")
    cached_classifier(x, y, SMALL, cache=tmp_path, log=lines.append)
    assert "unreadable" in lines[-2] and np.load(path)["w1"].shape == (784, 32)


@pytest.mark.slow
@pytest.mark.skipif(not MNIST.is_file(), reason="needs ../shared/data/mnist.npz")
def test_the_default_classifier_reaches_97_percent_on_binarized_test_digits(tmp_path):
    from txjax.data import PatchTokenizer, load_mnist

    data, tok = load_mnist(MNIST), PatchTokenizer()
    params, _ = cached_classifier(tok.binarize(data.x_train), data.y_train, cache=tmp_path, log=lambda _: None)
    acc = accuracy(params, tok.binarize(data.x_test), data.y_test)
    assert acc >= 0.97, acc
    real = digit_quality(params, tok.binarize(data.x_test[:1000]))
    assert real["classes"] == 10 and real["confident_share"] > 0.9
    assert not math.isnan(acc)
