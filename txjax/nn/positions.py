"""Position modules: what a stack adds to its input or to its attention logits for each `position`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from txjax import ops
from txjax.config import ROTARY_POSITIONS, TransformerConfig
from txjax.nn.layers import INIT, is_concrete


class Rotary(struct.PyTreeNode):
    """What rotates queries and keys (rope, scaled rope, xpos): static settings, no arrays.

    Both are rotated at their own positions, [T] or [B, T]; keys are rotated before they
    are cached, so a cached key is the one the full forward computes.
    """

    kind: str = struct.field(pytree_node=False)
    base: float = struct.field(pytree_node=False)
    scaling: str | None = struct.field(pytree_node=False)
    factor: float = struct.field(pytree_node=False)
    original_max_len: int = struct.field(pytree_node=False)
    xpos_scale_base: float = struct.field(pytree_node=False)

    @classmethod
    def of(cls, config: TransformerConfig) -> "Rotary | None":
        """The config's rotation; None for a position that does not rotate."""
        if config.position not in ROTARY_POSITIONS:
            return None
        original = config.max_len if config.rope_original_max_len is None else config.rope_original_max_len
        return cls(config.position, config.rope_base, config.rope_scaling, config.rope_scaling_factor,
                   original, config.xpos_scale_base)

    def _apply(self, x_BTNH: jax.Array, positions: jax.Array, downscale: bool) -> jax.Array:
        scaling = (self.scaling, self.factor, self.original_max_len)
        if self.kind == "xpos":
            return ops.apply_xpos(x_BTNH, positions, self.base, self.xpos_scale_base, downscale, *scaling)
        return ops.apply_rope(x_BTNH, positions, self.base, *scaling)

    def queries(self, q_BTNH: jax.Array, positions: jax.Array) -> jax.Array:
        return self._apply(q_BTNH, positions, downscale=False)

    def keys(self, k_BSNH: jax.Array, positions: jax.Array) -> jax.Array:
        return self._apply(k_BSNH, positions, downscale=True)


class RelativePositionBias(nnx.Module):
    """T5's learned scalar per (bucket, head), added to attention logits."""

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional = bidirectional
        self.num_buckets = config.num_buckets
        self.max_distance = config.max_distance
        self.table = nnx.Param(INIT(rngs.params(), (config.num_buckets, config.num_heads)))

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
        """[1, N, T, S]."""
        relative_TS = k_positions[None, :] - q_positions[:, None]
        bucket_TS = ops.t5_relative_position_bucket(
            relative_TS, self.bidirectional, self.num_buckets, self.max_distance
        )
        return jnp.transpose(self.table[...][bucket_TS], (2, 0, 1))[None]


class Positions(nnx.Module):
    """Everything a stack needs to know about position, for any `config.position`.

    learned / sinusoidal: `embed` gives a [T, D] table added to the input.
    t5 / alibi: `attention_bias` gives a [1, N, T, S] bias for self-attention.
    rope / xpos: `rotary` rotates the attention's queries and keys. none: nothing at all.
    """

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.kind = config.position
        self.max_len = config.max_len
        self.d_model = config.d_model
        self.num_heads = config.num_heads
        self.rotary = Rotary.of(config)
        self.table = (
            nnx.Param(INIT(rngs.params(), (config.max_len, config.d_model)))
            if self.kind == "learned" else None
        )
        self.relative = (
            RelativePositionBias(config, bidirectional=bidirectional, rngs=rngs)
            if self.kind == "t5" else None
        )

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
