"""NNX modules that own parameters and call the pure ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax import ops
from txjax.config import TransformerConfig

INIT = nnx.initializers.normal(stddev=0.02)


def is_concrete(x) -> bool:
    """True when `x` holds values we can inspect now (not a tracer under jit)."""
    return not isinstance(x, jax.core.Tracer)


def check_tokens(tokens: jax.Array, vocab_size: int, name: str = "tokens") -> None:
    """Rank and dtype always; the id range too when the values are concrete.

    Under jit the ids are unknown at trace time; `Embed` then looks out-of-range ids
    up as NaN (never a clamped row), so a bad id poisons the loss instead of hiding.
    """
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must be integer ids, got dtype {tokens.dtype}")
    if is_concrete(tokens) and tokens.size:
        ids = np.asarray(tokens)  # host-side: also works for a constant captured inside jit
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} has ids in [{lo}, {hi}], outside the vocabulary [0, {vocab_size})")


class Embed(nnx.Module):
    """Token embedding [V, D]; `attend` is the tied output head x @ E^T."""

    def __init__(self, num_embeddings: int, features: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.num_embeddings = num_embeddings
        self.dtype = jnp.dtype(dtype)  # of the looked-up rows; the table itself is float32
        self.embedding = nnx.Param(INIT(rngs.params(), (num_embeddings, features)))

    def __call__(self, ids: jax.Array) -> jax.Array:
        rows = jnp.take(self.embedding[...], ids, axis=0, mode="fill", fill_value=jnp.nan)
        return rows.astype(self.dtype)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        """Logits in float32 whatever the compute dtype: they feed softmax and the loss."""
        table_VD = self.embedding[...].astype(x_BTD.dtype)
        return jnp.einsum("BTD,VD->BTV", x_BTD, table_VD, preferred_element_type=jnp.float32)


class LayerNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,)))
        self.bias = nnx.Param(jnp.zeros((dim,)))

    def __call__(self, x):
        return ops.layer_norm(x, self.scale[...], self.bias[...], self.eps)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,)))

    def __call__(self, x):
        return ops.rms_norm(x, self.scale[...], self.eps)


def check_width(x: jax.Array, width: int, name: str) -> None:
    """A clear error for an input of the wrong width, before any matmul sees it."""
    if x.ndim != 3 or x.shape[-1] != width:
        raise ValueError(f"{name} expects [B, T, {width}], got shape {x.shape}")


def make_norm(config: TransformerConfig) -> LayerNorm | RMSNorm:
    cls = LayerNorm if config.norm == "layer" else RMSNorm
    return cls(config.d_model, config.norm_eps)


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)).

    Written with erf, not `jax.nn.gelu`'s erfc(-x / sqrt 2): XLA lowers erf to one
    rational polynomial but erfc to two branches and an exp (in a CPU train-step
    profile the GELU fusions took ~5 ms each instead of ~11). Same values to ~1e-7
    (tested); for x < -6 the result is 0 instead of a number below 1e-8 in magnitude.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * 0.7071067811865476))


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}


class Dense(nnx.Linear):
    """`nnx.Linear` (same parameters, same values) through `ops.dense`, whose kernel gradient
    XLA:CPU runs in its fast matmul form; other dtypes and backends take nnx.Linear's path."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        if out_sharding is not None or self.precision is not None or not ops.cpu_nn_grads(inputs, kernel):
            return super().__call__(inputs, out_sharding)
        return ops.dense(inputs, kernel, bias)


class FeedForward(nnx.Module):
    """D -> F -> D with an activation; gated: act(x W_in) * (x W_gate) (GEGLU, SwiGLU)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, f, bias = config.d_model, config.d_ff, config.use_bias
        self.activation = config.activation
        self.d_model = d
        dense = dict(use_bias=bias, kernel_init=INIT, dtype=jnp.dtype(config.dtype), rngs=rngs)
        self.wi = Dense(d, f, **dense)
        self.wg = Dense(d, f, **dense) if config.gated else None
        self.wo = Dense(f, d, **dense)

    def __call__(self, x_BTD):
        check_width(x_BTD, self.d_model, "FeedForward")
        h_BTF = ACTIVATIONS[self.activation](self.wi(x_BTD))
        if self.wg is not None:
            h_BTF = h_BTF * self.wg(x_BTD)
        return self.wo(h_BTF)


class MultiHeadAttention(nnx.Module):
    """Self-attention (kv_BSD is None) or cross-attention over kv_BSD.

    Projections D -> N*H with einops head split; the bias (masks, relative or ALiBi)
    comes from outside, as in t5x. `rope_positions` = (q_positions, k_positions)
    rotates q and k before the dot product.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, inner, bias = config.d_model, config.num_heads * config.head_size, config.use_bias
        self.num_heads = config.num_heads
        self.d_model = d
        self.scale = config.attention_scale
        self.rope_base = config.rope_base
        self.attention_impl = config.attention_impl
        dense = dict(use_bias=bias, kernel_init=INIT, dtype=jnp.dtype(config.dtype), rngs=rngs)
        self.q = Dense(d, inner, **dense)
        self.k = Dense(d, inner, **dense)
        self.v = Dense(d, inner, **dense)
        self.o = Dense(inner, d, **dense)

    def project_kv(self, kv_BSD: jax.Array) -> tuple[jax.Array, jax.Array]:
        n = self.num_heads
        return ops.split_heads(self.k(kv_BSD), n), ops.split_heads(self.v(kv_BSD), n)

    def __call__(
        self,
        x_BTD: jax.Array,
        kv_BSD: jax.Array | None = None,
        bias: jax.Array | None = None,
        rope_positions: tuple[jax.Array, jax.Array] | None = None,
        causal_block_size: int | None = None,
    ) -> jax.Array:
        """`causal_block_size`: self-attention whose bias hides every later key (see
        `ops.dot_product_attention`); the caller vouches for the bias."""
        check_width(x_BTD, self.d_model, "MultiHeadAttention query input")
        if kv_BSD is not None:
            check_width(kv_BSD, self.d_model, "MultiHeadAttention key/value input")
        q_BTNH = ops.split_heads(self.q(x_BTD), self.num_heads)
        k_BSNH, v_BSNH = self.project_kv(x_BTD if kv_BSD is None else kv_BSD)
        if rope_positions is not None:
            q_BTNH = ops.apply_rope(q_BTNH, rope_positions[0], self.rope_base)
            k_BSNH = ops.apply_rope(k_BSNH, rope_positions[1], self.rope_base)
        out_BTNH = ops.dot_product_attention(
            q_BTNH, k_BSNH, v_BSNH, bias, self.scale, implementation=self.attention_impl,
            causal_block_size=causal_block_size if kv_BSD is None else None,
        )
        return self.o(ops.merge_heads(out_BTNH))

    def attend(
        self, x_BTD: jax.Array, k_BSNH: jax.Array, v_BSNH: jax.Array, bias: jax.Array | None = None
    ) -> jax.Array:
        """Queries from x_BTD over keys and values already projected (T5's cached cross-attention)."""
        check_width(x_BTD, self.d_model, "MultiHeadAttention query input")
        q_BTNH = ops.split_heads(self.q(x_BTD), self.num_heads)
        out_BTNH = ops.dot_product_attention(
            q_BTNH, k_BSNH, v_BSNH, bias, self.scale, implementation=self.attention_impl
        )
        return self.o(ops.merge_heads(out_BTNH))

    def decode_step(
        self,
        x_BTD: jax.Array,
        k_cache_BSNH: jax.Array,
        v_cache_BSNH: jax.Array,
        index: jax.Array,
        bias: jax.Array | None = None,
        rope_positions_T: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Self-attention of T new tokens over a fixed-size cache of S slots.

        The new keys and values are written at slots index .. index + T - 1 (keys
        rotated at their positions first, under RoPE), then the queries attend over
        all S slots; `bias` must hide the slots they may not see. Returns
        (out_BTD, k_cache_BSNH, v_cache_BSNH) with the new entries in place.
        """
        check_width(x_BTD, self.d_model, "MultiHeadAttention query input")
        q_BTNH = ops.split_heads(self.q(x_BTD), self.num_heads)
        k_BTNH, v_BTNH = self.project_kv(x_BTD)
        if rope_positions_T is not None:
            q_BTNH = ops.apply_rope(q_BTNH, rope_positions_T, self.rope_base)
            k_BTNH = ops.apply_rope(k_BTNH, rope_positions_T, self.rope_base)
        start = (0, index, 0, 0)
        k_cache_BSNH = jax.lax.dynamic_update_slice(k_cache_BSNH, k_BTNH.astype(k_cache_BSNH.dtype), start)
        v_cache_BSNH = jax.lax.dynamic_update_slice(v_cache_BSNH, v_BTNH.astype(v_cache_BSNH.dtype), start)
        out_BTNH = ops.dot_product_attention(
            q_BTNH, k_cache_BSNH, v_cache_BSNH, bias, self.scale, implementation=self.attention_impl
        )
        return self.o(ops.merge_heads(out_BTNH)), k_cache_BSNH, v_cache_BSNH


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
