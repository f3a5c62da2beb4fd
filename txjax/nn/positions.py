"""Position modules: what a stack adds to its input or to its attention logits for each `position`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax import ops
from txjax.config import TransformerConfig
from txjax.nn.layers import INIT, is_concrete


class RelativePositionBias(nnx.Module):
    """T5's learned scalar per (bucket, head), added to attention logits."""

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional = bidirectional
        self.num_buckets = config.num_buckets
        self.max_distance = config.max_distance
        self.table = nnx.Param(INIT(rngs.params(), (config.num_buckets, config.num_heads)))

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
        """[1, N, T, S] from [T] and [S] positions; [B, N, T, S] from per-row ones."""
        bucket_BTS = ops.t5_relative_position_bucket(
            ops.relative_positions(q_positions, k_positions), self.bidirectional, self.num_buckets,
            self.max_distance)
        bias_BTSN = self.table[...][bucket_BTS if bucket_BTS.ndim == 3 else bucket_BTS[None]]
        return jnp.transpose(bias_BTSN, (0, 3, 1, 2))


class Positions(nnx.Module):
    """Everything a stack needs to know about position, for any `config.position`.

    learned / sinusoidal: `embed` gives a [T, D] table added to the input.
    t5 / alibi: `attention_bias` gives a [1, N, T, S] bias for self-attention.
    rope: `rope` is True and the attention rotates q and k. none: nothing at all.
    """

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.kind = config.position
        self.max_len = config.max_len
        self.d_model = config.d_model
        self.num_heads = config.num_heads
        self.table = (
            nnx.Param(INIT(rngs.params(), (config.max_len, config.d_model)))
            if self.kind == "learned" else None
        )
        self.relative = (
            RelativePositionBias(config, bidirectional=bidirectional, rngs=rngs)
            if self.kind == "t5" else None
        )

    @property
    def rope(self) -> bool:
        return self.kind == "rope"

    def embed(self, positions_T: jax.Array) -> jax.Array | None:
        if self.kind == "sinusoidal":
            return ops.sinusoidal_positions(positions_T, self.d_model)
        if self.kind != "learned":
            return None
        if positions_T.shape[-1] > self.max_len:
            raise ValueError(
                f"sequence length {positions_T.shape[-1]} exceeds max_len={self.max_len} "
                "of the learned position table"
            )
        if is_concrete(positions_T) and positions_T.size:
            last = int(np.max(np.asarray(positions_T)))
            if last >= self.max_len:
                raise ValueError(f"position {last} is beyond the learned table (max_len={self.max_len})")
        return jnp.take(self.table[...], positions_T, axis=0, mode="fill", fill_value=jnp.nan)

    def attention_bias(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array | None:
        if self.kind == "t5":
            return self.relative(q_positions, k_positions)
        if self.kind == "alibi":
            return ops.alibi_bias(self.num_heads, q_positions, k_positions)
        return None
