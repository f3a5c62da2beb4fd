"""Randomized positions (Ruoss et al. 2023): the positions, or the distances of a relative bias, drawn while training."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax import ops
from txjax.config import TransformerConfig


class RandomDraw(nnx.Module):
    """What both draws share: the range, an RNG stream, when to draw and for how many rows.

    The stream is forked like `nnx.Dropout`'s (the train step re-keys it every step and micro-
    batch, so a seed reproduces every draw); the `deterministic` flag is set by evaluation views,
    and `at_eval` draws in evaluation too, as the paper's code does. `per_batch`: one draw shared
    by every row of a batch (their code), else one per row.
    """

    def __init__(self, max_position: int, *, rngs: nnx.Rngs, at_eval: bool = False,
                 per_batch: bool = False, deterministic: bool = False):
        self.max_position = max_position
        self.at_eval = at_eval
        self.per_batch = per_batch
        self.deterministic = deterministic
        self.rngs = rngs["positions"].fork()

    @classmethod
    def of(cls, config: TransformerConfig, rngs: nnx.Rngs):
        """The draw `config.random_positions` asks for."""
        return cls(config.random_positions, rngs=rngs, at_eval=config.random_positions_eval,
                   per_batch=config.random_positions_per_batch)

    def set_view(self, deterministic: bool | None = None):
        """Used by `nnx.view` (and `.eval()` / `.train()`), as `nnx.Dropout` is."""
        if deterministic is not None:
            self.deterministic = deterministic

    @property
    def drawing(self) -> bool:
        return self.at_eval or not self.deterministic


class RandomPositions(RandomDraw):
    """Each row's positions: a sorted random subset of [0, max_position) when drawing, else None."""

    def __call__(self, batch: int, length: int, valid_BT: jax.Array | None = None) -> jax.Array | None:
        """int32 [B, T], or None: use 0..T-1. valid_BT (False at pads): the row's k-th real token
        gets the k-th of k sorted draws, so padding does not change a row's positions; a pad gets
        its preceding real token's position (pads are never attended to)."""
        if not self.drawing:
            return None
        if valid_BT is None:
            return ops.random_positions(self.rngs(), batch, length, self.max_position, shared=self.per_batch)
        drawn_BT = ops.random_positions(self.rngs(), batch, length, self.max_position,
                                        lengths_B=valid_BT.sum(axis=-1), shared=self.per_batch)
        rank_BT = jnp.maximum(jnp.cumsum(valid_BT, axis=-1) - 1, 0)
        return jnp.take_along_axis(drawn_BT, rank_BT, axis=1)


class RandomDistances(RandomDraw):
    """The distance at each offset (`ops.random_distances`) of ALiBi, T5's bias or KERPLE when drawing, else None.

    Owned by a stack's `Positions`, which draws once per forward pass for all its layers
    (`distances`) or once per layer (`layer_distances`, their code); positions stay 0..T-1.
    Packed documents share their row's draw."""

    def __call__(self, batch: int, length: int, valid_BT: jax.Array | None = None) -> jax.Array | None:
        """int32 [B, T], or None: distance = offset. valid_BT (False at pads; a row's real tokens
        one contiguous run): a row's offsets up to its real length are drawn as if it had no pads."""
        if not self.drawing:
            return None
        return ops.random_distances(self.rngs(), batch, length, self.max_position,
                                    None if valid_BT is None else valid_BT.sum(axis=-1), self.per_batch)
