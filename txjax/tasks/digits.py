"""A digit classifier on binarized MNIST, to measure whether sampled digits look like digits.

The GPT's test NLL says how well it models images; it does not say whether its samples
are recognisable. This classifier (a one-hidden-layer MLP on the 784 on/off pixels,
trained with Adam on the binarized training images) labels each sample; `digit_quality`
reports the share it labels with probability >= 0.9 and how many of the 10 classes
appear, figures to set beside the same ones for real test digits.

Its weights are cached (`txjax.data` cache folder, a file named by a digest of the
training bits, labels and the classifier's settings), so it is trained once per machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from txjax.data._io import atomic_path, cache_dir

CONFIDENT = 0.9
"""A sample counts as a recognisable digit when the classifier gives its label this probability."""


@dataclasses.dataclass(frozen=True)
class DigitClassifierConfig:
    """The classifier's shape and training; every field enters the cache file's name."""

    hidden: int = 512
    epochs: int = 8
    batch_size: int = 128
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 0


def _logits(params: dict, x_BP: jax.Array) -> jax.Array:
    h_BH = jax.nn.relu(x_BP @ params["w1"] + params["b1"][None, :])
    return h_BH @ params["w2"] + params["b2"][None, :]


def _init(cfg: DigitClassifierConfig, pixels: int, key) -> dict:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (pixels, cfg.hidden)) * (2.0 / pixels) ** 0.5,
            "b1": jnp.zeros(cfg.hidden),
            "w2": jax.random.normal(k2, (cfg.hidden, 10)) * (1.0 / cfg.hidden) ** 0.5,
            "b2": jnp.zeros(10)}


def _flat(bits_BHW: np.ndarray) -> np.ndarray:
    return np.asarray(bits_BHW, np.float32).reshape(len(bits_BHW), -1)


def train_classifier(bits_BHW: np.ndarray, labels_B: np.ndarray, cfg: DigitClassifierConfig) -> dict:
    """Parameters of an MLP fitted to on/off images [N, 28, 28] and their labels [N]."""
    x_NP, y_N = _flat(bits_BHW), np.asarray(labels_B, np.int32)
    params = _init(cfg, x_NP.shape[1], jax.random.key(cfg.seed))
    opt = optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, x_BP, y_B):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(_logits(p, x_BP), y_B).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    rng = np.random.default_rng(cfg.seed)
    n = len(x_NP) // cfg.batch_size * cfg.batch_size
    for _ in range(cfg.epochs):
        order = rng.permutation(len(x_NP))[:n].reshape(-1, cfg.batch_size)
        for idx in order:
            params, opt_state = step(params, opt_state, x_NP[idx], y_N[idx])
    return {k: np.asarray(v) for k, v in params.items()}


@jax.jit
def _probs(params: dict, x_BP: jax.Array) -> jax.Array:
    return jax.nn.softmax(_logits(params, x_BP))


def classify(params: dict, bits_BHW: np.ndarray, batch_size: int = 2000) -> np.ndarray:
    """Class probabilities [N, 10] for on/off images [N, 28, 28]."""
    x_NP = _flat(bits_BHW)
    out = [np.asarray(_probs(params, x_NP[i: i + batch_size])) for i in range(0, len(x_NP), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, 10), np.float32)


def accuracy(params: dict, bits_BHW: np.ndarray, labels_B: np.ndarray) -> float:
    return float(np.mean(classify(params, bits_BHW).argmax(axis=1) == np.asarray(labels_B)))


def digit_quality(params: dict, bits_BHW: np.ndarray) -> dict:
    """{"confident_share": share labelled with p >= CONFIDENT, "classes": distinct labels, "n": N}."""
    probs_N10 = classify(params, bits_BHW)
    return {"confident_share": float(np.mean(probs_N10.max(axis=1) >= CONFIDENT)),
            "classes": int(len(np.unique(probs_N10.argmax(axis=1)))),
            "n": int(len(probs_N10))}


def _digest(bits_BHW: np.ndarray, labels_B: np.ndarray, cfg: DigitClassifierConfig) -> str:
    h = hashlib.sha256(np.packbits(np.asarray(bits_BHW, bool)).tobytes())
    h.update(np.asarray(labels_B, np.int64).tobytes())
    h.update(repr(dataclasses.astuple(cfg)).encode())
    return h.hexdigest()[:16]


def cached_classifier(bits_BHW: np.ndarray, labels_B: np.ndarray, cfg: DigitClassifierConfig | None = None,
                      cache: str | os.PathLike | None = None, log=print) -> tuple[dict, Path]:
    """(parameters, their file): loaded from the cache, else trained and saved there.

    A cache that cannot be read is trained over; one that cannot be written is only warned about.
    """
    cfg = cfg or DigitClassifierConfig()
    path = cache_dir(cache) / f"digit_mlp-{_digest(bits_BHW, labels_B, cfg)}.npz"
    if path.is_file():
        try:
            with np.load(path) as f:
                return {k: f[k] for k in ("w1", "b1", "w2", "b2")}, path
        except (OSError, ValueError, KeyError) as err:
            log(f"digit classifier cache {path} unreadable ({err}); training it again")
    log(f"training the digit classifier ({cfg.epochs} epochs over {len(labels_B)} binarized images)")
    params = train_classifier(bits_BHW, labels_B, cfg)
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **params)
    except OSError as err:
        log(f"could not cache the digit classifier at {path}: {err}")
    return params, path


__all__ = ["CONFIDENT", "DigitClassifierConfig", "accuracy", "cached_classifier", "classify",
           "digit_quality", "train_classifier"]
