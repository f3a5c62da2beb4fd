"""Transformer block and stack: the one block serves encoder, decoder and cross-attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from txjax import ops
from txjax.config import TransformerConfig
from txjax.nn.layers import FeedForward, MultiHeadAttention, Positions, make_norm


class TransformerBlock(nnx.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    pre-norm:  x = x + f(norm(x))     (read normalised; GPT-2, T5)
    post-norm: x = norm(x + f(x))     (write normalised; the original Transformer, BERT)
    """

    def __init__(self, config: TransformerConfig, *, cross: bool, rngs: nnx.Rngs):
        self.pre = config.norm_position == "pre"
        self.self_attn = MultiHeadAttention(config, rngs=rngs)
        self.self_norm = make_norm(config)
        self.cross_attn = MultiHeadAttention(config, rngs=rngs) if cross else None
        self.cross_norm = make_norm(config) if cross else None
        self.ffn = FeedForward(config, rngs=rngs)
        self.ffn_norm = make_norm(config)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def _residual(self, x, norm, branch):
        if self.pre:
            return x + self.dropout(branch(norm(x)))
        return norm(x + self.dropout(branch(x)))

    def __call__(
        self,
        x_BTD: jax.Array,
        self_bias: jax.Array | None,
        rope_positions: tuple[jax.Array, jax.Array] | None = None,
        enc_BSD: jax.Array | None = None,
        cross_bias: jax.Array | None = None,
    ) -> jax.Array:
        x_BTD = self._residual(
            x_BTD, self.self_norm, lambda h: self.self_attn(h, None, self_bias, rope_positions)
        )
        if self.cross_attn is not None:
            if enc_BSD is None:
                raise ValueError("a cross-attending block needs the encoder output")
            x_BTD = self._residual(
                x_BTD, self.cross_norm, lambda h: self.cross_attn(h, enc_BSD, cross_bias)
            )
        return self._residual(x_BTD, self.ffn_norm, self.ffn)


class TransformerStack(nnx.Module):
    """Positions, `num_layers` blocks and (pre-norm) a final norm.

    The stack turns the boolean mask into the additive bias, once, and adds the
    relative bias (T5, ALiBi) of its own `positions` module, shared by every layer
    as in T5. Cross-attention gets only the encoder padding mask: no position signal
    crosses from one sequence to another.
    """

    def __init__(self, config: TransformerConfig, num_layers: int, *, causal: bool, cross: bool,
                 rngs: nnx.Rngs):
        self.causal = causal
        self.positions = Positions(config, bidirectional=not causal, rngs=rngs)
        self.blocks = nnx.List(
            [TransformerBlock(config, cross=cross, rngs=rngs) for _ in range(num_layers)]
        )
        self.final_norm = make_norm(config) if config.norm_position == "pre" else None
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def __call__(
        self,
        x_BTD: jax.Array,
        mask: jax.Array | None,
        positions_T: jax.Array,
        enc_BSD: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
    ) -> jax.Array:
        """x_BTD already holds token (+ absolute position) embeddings; mask is bool [B|1, 1, T, T]."""
        bias = None if mask is None else ops.mask_to_bias(mask)
        relative = self.positions.attention_bias(positions_T, positions_T)
        if relative is not None:
            bias = relative if bias is None else bias + relative
        rope = (positions_T, positions_T) if self.positions.rope else None
        cross_bias = None if cross_mask is None else ops.mask_to_bias(cross_mask)
        for block in self.blocks:
            x_BTD = block(x_BTD, bias, rope, enc_BSD, cross_bias)
        if self.final_norm is not None:
            x_BTD = self.final_norm(x_BTD)
        return x_BTD

    def embed_positions(self, x_BTD: jax.Array, positions_T: jax.Array) -> jax.Array:
        """Add the absolute position table (learned, sinusoidal) if there is one."""
        table = self.positions.embed(positions_T)
        if table is None:
            return x_BTD
        table_BTD = table if table.ndim == 3 else table[None]
        return x_BTD + table_BTD.astype(x_BTD.dtype)
