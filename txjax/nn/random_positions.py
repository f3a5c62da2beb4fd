"""Randomized positions (Ruoss et al. 2023): the positions a sequence is encoded at, drawn while training."""

from __future__ import annotations

import jax
import jax.numpy as jnp
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

    def __call__(self, batch: int, length: int, valid_BT: jax.Array | None = None) -> jax.Array | None:
        """int32 [B, T], or None: use 0..T-1. valid_BT (False at pads): the row's k-th real token
        gets the k-th of k sorted draws, so padding does not change a row's positions; a pad gets
        its preceding real token's position (pads are never attended to)."""
        if self.deterministic and not self.at_eval:
            return None
        if valid_BT is None:
            return ops.random_positions(self.rngs(), batch, length, self.max_position)
        drawn_BT = ops.random_positions(self.rngs(), batch, length, self.max_position,
                                        lengths_B=valid_BT.sum(axis=-1))
        rank_BT = jnp.maximum(jnp.cumsum(valid_BT, axis=-1) - 1, 0)
        return jnp.take_along_axis(drawn_BT, rank_BT, axis=1)
