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
    """One attention layer's keys and values, [B, S, N, H].

    `index` (int32 []): the slot where the next new keys go (self-attention while
    decoding). None: the keys are fixed (T5's cross-attention over a cached encoder).
    """

    k_BSNH: jax.Array
    v_BSNH: jax.Array
    index: jax.Array | None = None


class MultiHeadAttention(nnx.Module):
    """Projections D -> N*H, the attention of `txjax.ops`, the output projection N*H -> D.

    The bias (masks, relative or ALiBi) comes from outside, as in t5x; so does `rotary`
    (rope, scaled rope, xpos), which turns the queries and the new keys at `positions`,
    those of x's tokens.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 execution: ExecutionConfig = ExecutionConfig()):
        d, inner = config.d_model, config.num_heads * config.head_size
        self.num_heads = config.num_heads
        self.d_model = d
        self.scale = config.attention_scale
        self.attention_impl = execution.attention_impl
        dense = dense_kwargs(config, execution, rngs)
        self.xla_cpu_grads = dense["xla_cpu_grads"]
        self.q = Dense(d, inner, **dense)
        self.k = Dense(d, inner, **dense)
        self.v = Dense(d, inner, **dense)
        self.o = Dense(inner, d, **dense)

    def project_kv(self, kv_BSD: jax.Array) -> tuple[jax.Array, jax.Array]:
        n = self.num_heads
        return ops.split_heads(self.k(kv_BSD), n), ops.split_heads(self.v(kv_BSD), n)

    def qkv(self, x_BTD, kv_BSD=None, rotary: Rotary | None = None, positions=None,
            cache: LayerCache | None = None):
        """(q_BTNH, k_BSNH, v_BSNH, cache): what the queries attend over.

        Keys come from the cache when it holds fixed ones, else from kv_BSD (cross) or
        x_BTD (self), rotated at `positions`; a cache with an index gets the new
        keys written at index .. index + T - 1 and hands back all of its S slots.
        """
        check_width(x_BTD, self.d_model, "MultiHeadAttention query input")
        q_BTNH = ops.split_heads(self.q(x_BTD), self.num_heads)
        if cache is not None and cache.index is None:
            return q_BTNH, cache.k_BSNH, cache.v_BSNH, cache
        if kv_BSD is not None:
            check_width(kv_BSD, self.d_model, "MultiHeadAttention key/value input")
        k_BSNH, v_BSNH = self.project_kv(x_BTD if kv_BSD is None else kv_BSD)
        if rotary is not None:
            q_BTNH, k_BSNH = rotary.queries(q_BTNH, positions), rotary.keys(k_BSNH, positions)
        if cache is not None:
            start = (0, cache.index, 0, 0)
            cache = cache.replace(
                k_BSNH=jax.lax.dynamic_update_slice(cache.k_BSNH, k_BSNH.astype(cache.k_BSNH.dtype), start),
                v_BSNH=jax.lax.dynamic_update_slice(cache.v_BSNH, v_BSNH.astype(cache.v_BSNH.dtype), start),
            )
            k_BSNH, v_BSNH = cache.k_BSNH, cache.v_BSNH
        return q_BTNH, k_BSNH, v_BSNH, cache

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
        q_BTNH, k_BSNH, v_BSNH, cache = self.qkv(x_BTD, kv_BSD, rotary, positions, cache)
        attend = xla_cpu.dot_product_attention if self.xla_cpu_grads else ops.dot_product_attention
        out_BTNH = attend(q_BTNH, k_BSNH, v_BSNH, bias, self.scale, self.attention_impl, causal_block_size)
        return self.o(ops.merge_heads(out_BTNH)), cache
