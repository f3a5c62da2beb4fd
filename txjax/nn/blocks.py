"""Transformer block and stack: one `__call__` each, for a whole sequence or new tokens over a cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from txjax import ops
from txjax.config import ExecutionConfig, TransformerConfig
from txjax.nn.attention import LayerCache, MultiHeadAttention
from txjax.nn.layers import FeedForward, is_concrete, make_norm
from txjax.nn.positions import Positions, Rotary


@struct.dataclass
class KVCache:
    """What a causal stack remembers between decoding steps: a pytree of fixed shape.

    k[i], v[i] are layer i's keys and values, [B, S, K, H], S = the cache length and K
    the key/value heads (config.kv_heads: fewer than N under grouped-query attention);
    `index` (int32 []) counts the slots already written, so the next tokens go to
    positions index, index + 1, ...; `valid_BS` is False at slots that hold a pad
    token (or nothing yet). `start_B` (int32 [B] or None = 0): row b's sequence begins
    at slot start_B[b], after left padding (prompts of different lengths), so slot s
    holds position s - start_B[b]. T5 adds `cross_k[i]`, `cross_v[i]` ([B, S_enc, K, H],
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
    start_B: jax.Array | None = None

    @classmethod
    def zeros(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
              dtype=jnp.float32, **cross) -> "KVCache":
        """An empty cache of `max_len` slots per layer; `cross` sets the T5 fields."""
        shape = (batch, max_len, num_kv_heads, head_dim)
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

    def positions(self, slots: jax.Array) -> jax.Array:
        """The positions of the tokens at `slots` ([T]); per row ([B, T]) with a `start_B`, where
        left-padding slots get position 0 (they are never valid keys)."""
        if self.start_B is None:
            return slots
        return jnp.maximum(slots[None, :] - self.start_B[:, None], 0)

    def layer(self, i: int) -> tuple[LayerCache, LayerCache | None]:
        """Layer i's self-attention cache (written at `index`) and its fixed cross-attention keys."""
        cross = None if self.cross_k is None else LayerCache(self.cross_k[i], self.cross_v[i])
        return LayerCache(self.k[i], self.v[i], self.index), cross


class TransformerBlock(nnx.Module):
    """Self-attention, optional cross-attention, feed-forward; each a residual branch.

    pre-norm:  x = x + f(norm(x))     (read normalised; GPT-2, T5)
    post-norm: x = norm(x + f(x))     (write normalised; the original Transformer, BERT)
    """

    def __init__(self, config: TransformerConfig, *, cross: bool, rngs: nnx.Rngs, causal: bool = False,
                 execution: ExecutionConfig = ExecutionConfig()):
        self.pre = config.norm_position == "pre"
        # Only a causal stack's self-attention may skip the keys above the diagonal.
        self.causal_block_size = (execution.causal_block_size
                                  if causal and execution.attention_impl != "cudnn" else None)
        self.self_attn = MultiHeadAttention(config, rngs=rngs, execution=execution)
        self.self_norm = make_norm(config, execution)
        self.cross_attn = MultiHeadAttention(config, rngs=rngs, execution=execution) if cross else None
        self.cross_norm = make_norm(config, execution) if cross else None
        self.ffn = FeedForward(config, rngs=rngs, execution=execution)
        self.ffn_norm = make_norm(config, execution)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def _residual(self, x_BTD, norm, branch):
        """(x + f(norm(x)), aux) pre-norm, (norm(x + f(x)), aux) post-norm; branch(h) -> (f(h), aux)."""
        out_BTD, aux = branch(norm(x_BTD) if self.pre else x_BTD)
        x_BTD = x_BTD + self.dropout(out_BTD)
        return (x_BTD if self.pre else norm(x_BTD)), aux

    def __call__(
        self,
        x_BTD: jax.Array,
        bias: jax.Array | None,
        *,
        rotary: Rotary | None = None,
        positions: jax.Array | None = None,
        enc_BSD: jax.Array | None = None,
        cross_bias: jax.Array | None = None,
        cache: LayerCache | None = None,
        cross_cache: LayerCache | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """(x_BTD, cache): `cache` comes back with the new keys and values written.

        `rotary` turns self-attention's queries and keys at `positions`, the tokens' own.
        Cross-attention reads enc_BSD, or the encoder keys already in `cross_cache`.
        """
        blocks = self.causal_block_size if cache is None else None
        x_BTD, cache = self._residual(x_BTD, self.self_norm, lambda h: self.self_attn(
            h, bias, rotary=rotary, positions=positions, cache=cache, causal_block_size=blocks))
        if self.cross_attn is not None:
            if enc_BSD is None and cross_cache is None:
                raise ValueError("a cross-attending block needs the encoder output or its cached keys")
            x_BTD, _ = self._residual(x_BTD, self.cross_norm, lambda h: self.cross_attn(
                h, cross_bias, kv_BSD=enc_BSD, cache=cross_cache))
        x_BTD, _ = self._residual(x_BTD, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x_BTD, cache


def remat_block(block: TransformerBlock, x_BTD: jax.Array, bias, **kwargs):
    """`block(x_BTD, bias, **kwargs)` under `jax.checkpoint`: the backward pass recomputes the
    block's activations from its input instead of storing them (gradient checkpointing).

    The block is split into (graphdef, state) and merged inside the checkpointed
    function, so its dropout RNG counts advance exactly as without remat.
    """
    graphdef, state = nnx.split(block)

    def run(state, x_BTD, bias, kwargs):
        inner = nnx.merge(graphdef, state)
        return inner(x_BTD, bias, **kwargs), nnx.state(inner)

    out, state = jax.checkpoint(run)(state, x_BTD, bias, kwargs)
    nnx.update(block, state)
    return out


class TransformerStack(nnx.Module):
    """Positions, `num_layers` blocks and (pre-norm) a final norm.

    The stack builds the attention masks (`ops.attention_mask`, with the config's sliding
    `attention_window`, self-attention only), turns them into the
    additive bias once, and adds the relative bias (T5, ALiBi) of its own `positions`
    module, shared by every layer as in T5. Cross-attention gets only the encoder
    padding mask: no position signal crosses from one sequence to another.
    """

    def __init__(self, config: TransformerConfig, num_layers: int, *, causal: bool, cross: bool,
                 rngs: nnx.Rngs, execution: ExecutionConfig = ExecutionConfig()):
        self.causal = causal
        self.window = config.attention_window
        self.remat = execution.remat
        self.positions = Positions(config, bidirectional=not causal, rngs=rngs)
        self.blocks = nnx.List([
            TransformerBlock(config, cross=cross, causal=causal, rngs=rngs, execution=execution)
            for _ in range(num_layers)
        ])
        self.final_norm = make_norm(config, execution) if config.norm_position == "pre" else None

    def _with_new_tokens(self, cache: KVCache, t: int, valid_BT: jax.Array | None) -> KVCache:
        """The cache with the validity of T new tokens at slots index .. index + T - 1 (left
        padding before a row's `start_B` is never valid)."""
        if not self.causal:
            raise ValueError("a cache needs a causal stack; an encoder has none")
        s = cache.max_len
        if t > s or (is_concrete(cache.index) and int(cache.index) + t > s):
            raise ValueError(f"{t} new tokens do not fit the cache of {s} slots (index {cache.index})")
        if valid_BT is None:
            valid_BT = jnp.ones((cache.valid_BS.shape[0], t), bool)
        if cache.start_B is not None:
            slots_T = cache.index + jnp.arange(t, dtype=jnp.int32)
            valid_BT = valid_BT & (slots_T[None, :] >= cache.start_B[:, None])
        return cache.replace(
            valid_BS=jax.lax.dynamic_update_slice(cache.valid_BS, valid_BT, (0, cache.index)))

    def self_bias(self, q_positions_T, k_positions_S, k_valid_BS=None, documents_BT=None,
                  distances_BR=None) -> jax.Array | None:
        """The additive self-attention bias: the mask as 0 / -inf plus the relative bias, if any."""
        mask = ops.attention_mask(q_positions_T, k_positions_S, causal=self.causal, k_valid_BS=k_valid_BS,
                                  window=self.window, q_documents_BT=documents_BT, k_documents_BS=documents_BT)
        bias = None if mask is None else ops.mask_to_bias(mask)
        relative = self.positions.attention_bias(q_positions_T, k_positions_S, distances_BR)
        if relative is not None:
            bias = relative if bias is None else bias + relative
        return bias

    def _drawn_bias(self, positions_T, valid_BT, documents_BT, batch: int) -> tuple[jax.Array | None, jax.Array]:
        """(self-attention bias, query positions) of a whole-sequence pass: with the random
        positions or distances of a layer's draw (training), else with positions_T."""
        drawn_BT = self.positions.layer_positions(batch, positions_T.shape[-1], valid_BT)
        if drawn_BT is not None:  # `layers`: positions drawn inside attention
            return self.self_bias(drawn_BT, drawn_BT, valid_BT, documents_BT), drawn_BT
        distances_BR = self.positions.distances(batch, positions_T.shape[-1], valid_BT)
        return self.self_bias(positions_T, positions_T, valid_BT, documents_BT, distances_BR), positions_T

    def __call__(
        self,
        x_BTD: jax.Array,
        positions_T: jax.Array,
        *,
        valid_BT: jax.Array | None = None,
        documents_BT: jax.Array | None = None,
        enc_BSD: jax.Array | None = None,
        enc_valid_BS: jax.Array | None = None,
        enc_documents_BS: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """(h_BTD, cache) for x_BTD, the embedded tokens (absolute positions already added).

        positions_T: the tokens' positions. valid_BT: False at pad tokens, whose keys are
        hidden (None: all real). documents_BT (packed sequences): a token attends only to
        tokens of its own document id. enc_BSD / enc_valid_BS / enc_documents_BS: the
        encoder output a cross-attending stack reads, its real (non-pad) keys, and their
        documents (a decoder token reads only its own document's encoder tokens).
        cache: the T tokens sit at positions index .. index + T - 1 of a causal stack's
        cache and query t sees slot s iff s <= index + t and the slot holds a real token,
        so stale or empty slots never leak in; the cache comes back with their keys and
        values written and `index` advanced by T.
        """
        if cache is None:
            if documents_BT is not None and self.positions.random_layer_positions is not None:
                raise ValueError("random positions drawn per layer are for unpacked rows")
            bias, q_positions = self._drawn_bias(positions_T, valid_BT, documents_BT, x_BTD.shape[0])
            cross_mask = ops.attention_mask(None, None, causal=False, k_valid_BS=enc_valid_BS,
                                            q_documents_BT=documents_BT if enc_documents_BS is not None else None,
                                            k_documents_BS=enc_documents_BS)
        else:
            if documents_BT is not None or enc_documents_BS is not None:
                raise ValueError("packed documents are for whole sequences; a cache decodes one sequence per row")
            cache = self._with_new_tokens(cache, x_BTD.shape[1], valid_BT)
            k_positions_S = cache.positions(jnp.arange(cache.max_len, dtype=jnp.int32))
            bias, q_positions = self.self_bias(positions_T, k_positions_S, cache.valid_BS, documents_BT), positions_T
            cross_mask = cache.cross_mask
        cross_bias = None if cross_mask is None else ops.mask_to_bias(cross_mask)
        kwargs = dict(rotary=self.positions.rotary, positions=q_positions, enc_BSD=enc_BSD, cross_bias=cross_bias)
        layers = []
        for i, block in enumerate(self.blocks):
            if i and cache is None and self.positions.draws_per_layer:  # this layer's own draw
                bias, kwargs["positions"] = self._drawn_bias(positions_T, valid_BT, documents_BT, x_BTD.shape[0])
            if cache is None and self.remat:
                x_BTD, layer = remat_block(block, x_BTD, bias, **kwargs)
            else:
                self_cache, cross_cache = (None, None) if cache is None else cache.layer(i)
                x_BTD, layer = block(x_BTD, bias, **kwargs, cache=self_cache, cross_cache=cross_cache)
            layers.append(layer)
        if self.final_norm is not None:
            x_BTD = self.final_norm(x_BTD)
        if cache is not None:
            cache = cache.replace(k=tuple(c.k_BSKH for c in layers), v=tuple(c.v_BSKH for c in layers),
                                  index=cache.index + x_BTD.shape[1])
        return x_BTD, cache

    def embed_positions(self, x_BTD: jax.Array, positions_T: jax.Array) -> jax.Array:
        """Add the absolute position table (learned, sinusoidal) if there is one."""
        table = self.positions.embed(positions_T)
        if table is None:
            return x_BTD
        table_BTD = table if table.ndim == 3 else table[None]
        return x_BTD + table_BTD.astype(x_BTD.dtype)
