"""Held-out bits per character of a causal LM over a text cut into windows of W tokens.

- non-overlapping: every target is scored, so early targets in a window have little context;
- sliding: windows advance by `stride`; after the first window each scores only its last
  `stride` targets, so every target sees at least W - stride tokens of context (Press et al. 2022).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from txjax.config import GPTConfig

LN2 = math.log(2.0)


def nonoverlapping_windows(ids: np.ndarray, window: int, n_tokens: int):
    """(inputs_NW, targets_NW, scored_NW) cutting ids[0 .. n_tokens] into n_tokens / window windows."""
    if n_tokens % window or n_tokens + 1 > len(ids):
        raise ValueError(f"need n_tokens ({n_tokens}) divisible by window ({window}) and <= len(ids) - 1")
    inputs = ids[:n_tokens].reshape(-1, window)
    targets = ids[1: n_tokens + 1].reshape(-1, window)
    return inputs, targets, np.ones(inputs.shape, bool)


def sliding_windows(ids: np.ndarray, window: int, stride: int, n_tokens: int):
    """(inputs_NW, targets_NW, scored_NW): windows every `stride`; the first scores all, the rest their last `stride`.

    Every target ids[1 .. n_tokens] is scored exactly once.
    """
    if window > n_tokens or (n_tokens - window) % stride or n_tokens + 1 > len(ids) or not 1 <= stride <= window:
        raise ValueError(f"window {window}, stride {stride} do not tile {n_tokens} tokens of {len(ids)}")
    starts = np.arange(0, n_tokens - window + 1, stride)
    offsets = np.arange(window)
    inputs = ids[starts[:, None] + offsets[None, :]]
    targets = ids[starts[:, None] + offsets[None, :] + 1]
    scored = np.zeros(inputs.shape, bool)
    scored[0] = True
    scored[1:, window - stride:] = True
    return inputs, targets, scored


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scored_bits(logits_fn: Callable, inputs_NW: np.ndarray, targets_NW: np.ndarray, scored_NW: np.ndarray,
                batch: int) -> float:
    """Mean bits per scored target; batches are padded to `batch` rows so one compile serves all."""
    total, count = 0.0, 0
    for i in range(0, len(inputs_NW), batch):
        x = inputs_NW[i: i + batch]
        n = len(x)
        if n < batch:
            x = np.concatenate([x, np.repeat(x[-1:], batch - n, axis=0)])
        logp_BWV = log_softmax(np.asarray(logits_fn(x.astype(np.int32))))[:n]
        nll_BW = -np.take_along_axis(logp_BWV, targets_NW[i: i + n, :, None].astype(np.int64), axis=-1)[..., 0]
        total += float(nll_BW[scored_NW[i: i + n]].sum())
        count += int(scored_NW[i: i + n].sum())
    return total / count / LN2


def bits_per_char(logits_fn: Callable, config: GPTConfig, ids: np.ndarray, window: int, n_tokens: int,
                  stride: int | None = None, batch_tokens: int = 16384) -> float | None:
    """Held-out bits/char at `window` (sliding when `stride` is given); None where a learned table is too short."""
    if config.position == "learned" and window > config.max_len:
        return None
    if stride is None:
        arrays = nonoverlapping_windows(ids, window, n_tokens)
    else:
        arrays = sliding_windows(ids, window, stride, n_tokens)
    return scored_bits(logits_fn, *arrays, batch=max(1, batch_tokens // window))


