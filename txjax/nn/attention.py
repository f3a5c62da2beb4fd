"""Multi-head attention: one `__call__` for self- and cross-attention, with an optional cache."""

from __future__ import annotations

import jax
from flax import nnx, struct

from txjax import ops
from txjax.config import ExecutionConfig, TransformerConfig
from txjax.nn.layers import Dense, check_width, dense_kwargs
from txjax.nn.positions import Rotary
from txjax.ops import xla_cpu


@struct.dataclass
class LayerCache:
    """One attention layer's keys and values, [B, S, K, H] (K = config.kv_heads).

    `index` (int32 []): the slot where the next new keys go (self-attention while
    decoding). None: the keys are fixed (T5's cross-attention over a cached encoder).
    """

    k_BSKH: jax.Array
    v_BSKH: jax.Array
    index: jax.Array | None = None


class MultiHeadAttention(nnx.Module):
    """Projections D -> N*H (queries) and D -> K*H (keys, values), the attention of `txjax.ops`,
    the output projection N*H -> D. K < N is grouped-query attention: each key/value head
    serves N / K query heads (`ops.dot_product_attention` takes them without a copy).

    The bias (masks, relative or ALiBi) comes from outside, as in t5x; so does `rotary`
    (rope, scaled rope, xpos), which turns the queries and the new keys at `positions`,
    those of x's tokens.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 execution: ExecutionConfig = ExecutionConfig()):
        d, inner = config.d_model, config.num_heads * config.head_size
        self.num_heads, self.num_kv_heads = config.num_heads, config.kv_heads
        kv_inner = config.kv_heads * config.head_size
        self.d_model = d
        self.scale = config.attention_scale
        self.attention_impl = execution.attention(jax.default_backend())
        dense = dense_kwargs(config, execution, rngs)
        self.xla_cpu_grads = dense["xla_cpu_grads"]
        self.q = Dense(d, inner, **dense)
        self.k = Dense(d, kv_inner, **dense)
        self.v = Dense(d, kv_inner, **dense)
        self.o = Dense(inner, d, **dense)

    def project_kv(self, kv_BSD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(k_BSKH, v_BSKH) of kv_BSD."""
        k = self.num_kv_heads
        return ops.split_heads(self.k(kv_BSD), k), ops.split_heads(self.v(kv_BSD), k)

    def qkv(self, x_BTD, kv_BSD=None, rotary: Rotary | None = None, positions=None,
            cache: LayerCache | None = None):
        """(q_BTNH, k_BSKH, v_BSKH, cache): what the queries attend over.

        Keys come from the cache when it holds fixed ones, else from kv_BSD (cross) or
        x_BTD (self), rotated at `positions`; a cache with an index gets the new
        keys written at index .. index + T - 1 and hands back all of its S slots.
        """
        check_width(x_BTD, self.d_model, "MultiHeadAttention query input")
        q_BTNH = ops.split_heads(self.q(x_BTD), self.num_heads)
        if cache is not None and cache.index is None:
            return q_BTNH, cache.k_BSKH, cache.v_BSKH, cache
        if kv_BSD is not None:
            check_width(kv_BSD, self.d_model, "MultiHeadAttention key/value input")
        k_BSKH, v_BSKH = self.project_kv(x_BTD if kv_BSD is None else kv_BSD)
        if rotary is not None:
            q_BTNH, k_BSKH = rotary.queries(q_BTNH, positions), rotary.keys(k_BSKH, positions)
        if cache is not None:
            start = (0, cache.index, 0, 0)
            cache = cache.replace(
                k_BSKH=jax.lax.dynamic_update_slice(cache.k_BSKH, k_BSKH.astype(cache.k_BSKH.dtype), start),
                v_BSKH=jax.lax.dynamic_update_slice(cache.v_BSKH, v_BSKH.astype(cache.v_BSKH.dtype), start),
            )
            k_BSKH, v_BSKH = cache.k_BSKH, cache.v_BSKH
        return q_BTNH, k_BSKH, v_BSKH, cache

    def __call__(
        self,
        x_BTD: jax.Array,
        bias: jax.Array | None = None,
        *,
        kv_BSD: jax.Array | None = None,
        rotary: Rotary | None = None,
        positions: jax.Array | None = None,
        cache: LayerCache | None = None,
        causal_block_size: int | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """(out_BTD, cache): self-attention (kv_BSD None) or cross-attention over kv_BSD.

        With a cache the queries attend over its S slots, and `bias` must hide those they
        may not see. `causal_block_size`: the bias hides every later key (see
        `ops.dot_product_attention`); the caller vouches for it.
        """
        q_BTNH, k_BSKH, v_BSKH, cache = self.qkv(x_BTD, kv_BSD, rotary, positions, cache)
        attend = xla_cpu.dot_product_attention if self.xla_cpu_grads else ops.dot_product_attention
        out_BTNH = attend(q_BTNH, k_BSKH, v_BSKH, bias, self.scale, self.attention_impl, causal_block_size)
        return self.o(ops.merge_heads(out_BTNH)), cache
