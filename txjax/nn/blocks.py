"""Transformer block and stack: the one block serves encoder, decoder and cross-attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from txjax import ops
from txjax.config import TransformerConfig
from txjax.nn.layers import FeedForward, MultiHeadAttention, Positions, is_concrete, make_norm


@struct.dataclass
class KVCache:
    """What a causal stack remembers between decoding steps: a pytree of fixed shape.

    k[i], v[i] are layer i's keys and values, [B, S, N, H], S = the cache length;
    `index` (int32 []) counts the slots already written, so the next tokens go to
    positions index, index + 1, ...; `valid_BS` is False at slots that hold a pad
    token (or nothing yet). T5 adds `cross_k[i]`, `cross_v[i]` ([B, S_enc, N, H],
    projected once from the encoder output) and `cross_mask` (bool [B, 1, 1, S_enc]
    or None). Shapes never change while decoding, so one compiled step serves every
    position.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    index: jax.Array
    valid_BS: jax.Array
    cross_k: tuple[jax.Array, ...] | None = None
    cross_v: tuple[jax.Array, ...] | None = None
    cross_mask: jax.Array | None = None

    @classmethod
    def zeros(cls, num_layers: int, batch: int, max_len: int, num_heads: int, head_dim: int,
              dtype=jnp.float32, **cross) -> "KVCache":
        """An empty cache of `max_len` slots per layer; `cross` sets the T5 fields."""
        shape = (batch, max_len, num_heads, head_dim)
        return cls(
            k=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
            v=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
            index=jnp.zeros((), jnp.int32),
            valid_BS=jnp.zeros((batch, max_len), bool),
            **cross,
        )

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]


class TransformerBlock(nnx.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    pre-norm:  x = x + f(norm(x))     (read normalised; GPT-2, T5)
    post-norm: x = norm(x + f(x))     (write normalised; the original Transformer, BERT)
    """

    def __init__(self, config: TransformerConfig, *, cross: bool, rngs: nnx.Rngs, causal: bool = False):
        self.pre = config.norm_position == "pre"
        # Only a causal stack's self-attention may skip the keys above the diagonal.
        self.causal_block_size = (config.causal_block_size
                                  if causal and config.attention_impl != "cudnn" else None)
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

    def _read(self, x, norm):
        return norm(x) if self.pre else x

    def _write(self, x, norm, out):
        return x + self.dropout(out) if self.pre else norm(x + self.dropout(out))

    def __call__(
        self,
        x_BTD: jax.Array,
        self_bias: jax.Array | None,
        rope_positions: tuple[jax.Array, jax.Array] | None = None,
        enc_BSD: jax.Array | None = None,
        cross_bias: jax.Array | None = None,
    ) -> jax.Array:
        x_BTD = self._residual(
            x_BTD, self.self_norm,
            lambda h: self.self_attn(h, None, self_bias, rope_positions, self.causal_block_size),
        )
        if self.cross_attn is not None:
            if enc_BSD is None:
                raise ValueError("a cross-attending block needs the encoder output")
            x_BTD = self._residual(
                x_BTD, self.cross_norm, lambda h: self.cross_attn(h, enc_BSD, cross_bias)
            )
        return self._residual(x_BTD, self.ffn_norm, self.ffn)

    def decode_step(
        self,
        x_BTD: jax.Array,
        k_cache_BSNH: jax.Array,
        v_cache_BSNH: jax.Array,
        index: jax.Array,
        self_bias: jax.Array | None,
        rope_positions_T: jax.Array | None = None,
        cross_kv: tuple[jax.Array, jax.Array] | None = None,
        cross_bias: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`__call__` for T new tokens over this layer's cache -> (x_BTD, k_cache, v_cache)."""
        out_BTD, k_cache_BSNH, v_cache_BSNH = self.self_attn.decode_step(
            self._read(x_BTD, self.self_norm), k_cache_BSNH, v_cache_BSNH, index, self_bias,
            rope_positions_T,
        )
        x_BTD = self._write(x_BTD, self.self_norm, out_BTD)
        if self.cross_attn is not None:
            if cross_kv is None:
                raise ValueError("a cross-attending block needs the cached encoder keys and values")
            x_BTD = self._residual(
                x_BTD, self.cross_norm, lambda h: self.cross_attn.attend(h, *cross_kv, cross_bias)
            )
        return self._residual(x_BTD, self.ffn_norm, self.ffn), k_cache_BSNH, v_cache_BSNH


def remat_block(block: TransformerBlock, *args) -> jax.Array:
    """`block(*args)` under `jax.checkpoint`: the backward pass recomputes the block's
    activations from its input instead of storing them (gradient checkpointing).

    The block is split into (graphdef, state) and merged inside the checkpointed
    function, so its dropout RNG counts advance exactly as without remat.
    """
    graphdef, state = nnx.split(block)

    def run(state, *args):
        inner = nnx.merge(graphdef, state)
        return inner(*args), nnx.state(inner)

    out_BTD, state = jax.checkpoint(run)(state, *args)
    nnx.update(block, state)
    return out_BTD


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
        self.remat = config.remat
        self.positions = Positions(config, bidirectional=not causal, rngs=rngs)
        self.blocks = nnx.List(
            [TransformerBlock(config, cross=cross, causal=causal, rngs=rngs) for _ in range(num_layers)]
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
            if self.remat:
                x_BTD = remat_block(block, x_BTD, bias, rope, enc_BSD, cross_bias)
            else:
                x_BTD = block(x_BTD, bias, rope, enc_BSD, cross_bias)
        if self.final_norm is not None:
            x_BTD = self.final_norm(x_BTD)
        return x_BTD

    def decode_step(
        self, x_BTD: jax.Array, cache: KVCache, valid_BT: jax.Array | None = None
    ) -> tuple[jax.Array, KVCache]:
        """Run T new tokens (embedded, positions added) through the stack over `cache`.

        Query t sits at position index + t and sees cache slot s iff s <= index + t and
        the slot holds a non-pad token (`valid_BT` marks the new ones; None: all valid),
        so stale or empty slots never leak in. Relative biases (T5, ALiBi) are computed
        for these query rows against every slot position; RoPE rotates the new queries
        and keys at their positions. Returns the (final-normed) hidden states and the
        cache with the new keys and values written and `index` advanced by T.
        """
        if not self.causal:
            raise ValueError("decode_step needs a causal stack; an encoder has no cache")
        t, s = x_BTD.shape[1], cache.max_len
        if t > s or (is_concrete(cache.index) and int(cache.index) + t > s):
            raise ValueError(
                f"{t} new tokens do not fit the cache of {s} slots (index {cache.index})"
            )
        if valid_BT is None:
            valid_BT = jnp.ones((x_BTD.shape[0], t), bool)
        cache = cache.replace(
            valid_BS=jax.lax.dynamic_update_slice(cache.valid_BS, valid_BT, (0, cache.index))
        )
        q_positions_T = cache.index + jnp.arange(t, dtype=jnp.int32)
        k_positions_S = jnp.arange(s, dtype=jnp.int32)
        causal_1TS = (k_positions_S[None, :] <= q_positions_T[:, None])[None]
        bias = ops.mask_to_bias(causal_1TS[:, None] & cache.valid_BS[:, None, None, :])
        relative = self.positions.attention_bias(q_positions_T, k_positions_S)
        if relative is not None:
            bias = bias + relative
        rope = q_positions_T if self.positions.rope else None
        cross_bias = None if cache.cross_mask is None else ops.mask_to_bias(cache.cross_mask)
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            cross_kv = None if cache.cross_k is None else (cache.cross_k[i], cache.cross_v[i])
            x_BTD, k, v = block.decode_step(
                x_BTD, cache.k[i], cache.v[i], cache.index, bias, rope, cross_kv, cross_bias
            )
            ks.append(k)
            vs.append(v)
        if self.final_norm is not None:
            x_BTD = self.final_norm(x_BTD)
        return x_BTD, cache.replace(k=tuple(ks), v=tuple(vs), index=cache.index + t)

    def embed_positions(self, x_BTD: jax.Array, positions_T: jax.Array) -> jax.Array:
        """Add the absolute position table (learned, sinusoidal) if there is one."""
        table = self.positions.embed(positions_T)
        if table is None:
            return x_BTD
        table_BTD = table if table.ndim == 3 else table[None]
        return x_BTD + table_BTD.astype(x_BTD.dtype)
