"""Positional encodings as pure functions: sinusoidal, RoPE, T5 buckets, ALiBi."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal_positions(positions_T: jax.Array, dim: int) -> jax.Array:
    """[T, dim] table of "Attention Is All You Need": sin on even, cos on odd channels.

    PE[p, 2i] = sin(p / 10000^(2i/dim)),  PE[p, 2i+1] = cos(p / 10000^(2i/dim)).
    """
    if dim % 2:
        raise ValueError(f"sinusoidal_positions: dim must be even, got {dim}")
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    positions = jnp.asarray(positions_T, jnp.float32)
    angles_TK = positions[..., None] * inv_freq.reshape((1,) * positions.ndim + (-1,))
    table = jnp.stack([jnp.sin(angles_TK), jnp.cos(angles_TK)], axis=-1)
    return table.reshape(*angles_TK.shape[:-1], dim)


def apply_rope(x_BTNH: jax.Array, positions_T: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary embedding, rotate-half layout (GPT-NeoX, Llama).

    Channel pairs (i, i + H/2) are rotated by the angle p * base^(-2i/H), so that
    <rope(q, m), rope(k, n)> depends on m - n only. `positions_T` is [T] or [B, T].
    """
    h = x_BTNH.shape[-1]
    if h % 2:
        raise ValueError(f"apply_rope: head width must be even, got {h}")
    inv_freq = 1.0 / (base ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    positions = jnp.asarray(positions_T, jnp.float32)
    if positions.ndim == 1:
        positions = positions[None]
    angles_BTK = positions[..., None] * inv_freq[None, None, :]
    cos_BT1H = jnp.concatenate([jnp.cos(angles_BTK)] * 2, axis=-1)[:, :, None, :]
    sin_BT1H = jnp.concatenate([jnp.sin(angles_BTK)] * 2, axis=-1)[:, :, None, :]
    x32 = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos_BT1H + rotated * sin_BT1H).astype(x_BTNH.dtype)


def t5_relative_position_bucket(
    relative_position: jax.Array,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> jax.Array:
    """Bucket of `relative_position = key_pos - query_pos`, as in the T5 paper's code.

    Half the buckets (per direction, when bidirectional) hold exact offsets 0..max_exact-1;
    the rest grow logarithmically up to `max_distance`, beyond which all offsets share
    the last bucket. Unidirectional: keys after the query all fall in bucket 0.
    """
    ret = jnp.zeros_like(relative_position, dtype=jnp.int32)
    n = -jnp.asarray(relative_position, jnp.int32)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        jnp.log(n.astype(jnp.float32) / max_exact + np.finfo(np.float32).eps)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(jnp.int32)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


def alibi_slopes(num_heads: int) -> jax.Array:
    """Head slopes of ALiBi (Press et al. 2022): geometric from 2^(-8/n).

    For a head count that is not a power of two, the paper's recipe: the slopes of
    the closest smaller power of two, then every other slope of twice that.
    """

    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if num_heads < 1:
        raise ValueError(f"alibi_slopes: num_heads must be >= 1, got {num_heads}")
    if math.log2(num_heads).is_integer():
        slopes = power_of_2(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_2(closest) + power_of_2(2 * closest)[0::2][: num_heads - closest]
    return jnp.asarray(slopes, jnp.float32)


def relative_positions(q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """key_pos - query_pos, [T, S] from [T] and [S] positions, or [B, T, S] from per-row [B, T] and [B, S]."""
    return jnp.asarray(k_positions)[..., None, :] - jnp.asarray(q_positions)[..., :, None]


def alibi_bias(num_heads: int, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """[1, N, T, S] bias -slope_n * |q_pos - k_pos| ([B, N, T, S] for per-row positions).

    For causal attention this is the paper's slope * (k - q) on every key a query may
    see; the absolute value makes the same function serve bidirectional attention.
    """
    distance_BTS = jnp.abs(relative_positions(q_positions, k_positions)).astype(jnp.float32)
    distance_BTS = distance_BTS if distance_BTS.ndim == 3 else distance_BTS[None]
    return -alibi_slopes(num_heads)[None, :, None, None] * distance_BTS[:, None]


def random_positions(key: jax.Array, batch: int, length: int, max_position: int) -> jax.Array:
    """int32 [B, T]: per row, T distinct positions drawn uniformly from [0, max_position), sorted.

    Ruoss et al. 2023 ("Randomized Positional Encodings Boost Length Generalization"): trained
    on such positions, a model has seen every position up to max_position, not only 0..T-1.
    """
    if length > max_position:
        raise ValueError(f"random_positions: {length} tokens need max_position >= {length}, got {max_position}")
    ranks_BR = jnp.argsort(jax.random.uniform(key, (batch, max_position)), axis=-1)
    return jnp.sort(ranks_BR[:, :length], axis=-1).astype(jnp.int32)
