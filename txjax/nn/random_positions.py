"""Randomized positions (Ruoss et al. 2023): the positions a sequence is encoded at, drawn while training."""

from __future__ import annotations

import jax
from flax import nnx

from txjax import ops


class RandomPositions(nnx.Module):
    """Each row's positions: a sorted random subset of [0, max_position) when training, else None.

    It owns an RNG stream like `nnx.Dropout` (the train step re-keys it every step and micro-
    batch, so a seed reproduces every draw) and a `deterministic` flag that evaluation views set;
    `at_eval` draws in evaluation too, as the paper's code does.
    """

    def __init__(self, max_position: int, *, rngs: nnx.Rngs, at_eval: bool = False,
                 deterministic: bool = False):
        self.max_position = max_position
        self.at_eval = at_eval
        self.deterministic = deterministic
        self.rngs = rngs["positions"].fork()

    def set_view(self, deterministic: bool | None = None):
        """Used by `nnx.view` (and `.eval()` / `.train()`), as `nnx.Dropout` is."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(self, batch: int, length: int) -> jax.Array | None:
        """int32 [B, T], or None: use 0..T-1."""
        if self.deterministic and not self.at_eval:
            return None
        return ops.random_positions(self.rngs(), batch, length, self.max_position)
