"""Positional encodings as pure functions: sinusoidal, RoPE (and its scalings), xPos, T5 buckets, ALiBi."""

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


ROPE_SCALINGS = ("linear", "ntk", "yarn")


def rope_inv_freq(head_dim: int, base: float = 10000.0, scaling: str | None = None,
                  factor: float = 1.0, original_max_len: int | None = None) -> jax.Array:
    """inv_freq_K (K = H/2): the angle per position of channel pair i, base^(-2i/H), for a RoPE scaling.

    None / "linear": unchanged (linear interpolation divides the positions instead).
    "ntk": the base becomes base * factor^(H/(H-2)) (NTK-aware scaling, bloc97 2023).
    "yarn": per pair, a ramp from the original frequency (pairs that turn more than
    beta_fast = 32 times over `original_max_len`) to it divided by `factor` (fewer than
    beta_slow = 1 turns), as in Peng et al. 2023 and Hugging Face's `_compute_yarn_parameters`.
    A factor of 1 gives the plain frequencies exactly.
    """
    if scaling not in (None,) + ROPE_SCALINGS:
        raise ValueError(f"rope scaling {scaling!r} is not one of {ROPE_SCALINGS} or None")
    if scaling == "ntk" and factor != 1.0:
        base = base * factor ** (head_dim / (head_dim - 2))
    inv_freq_K = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling != "yarn" or factor == 1.0:
        return inv_freq_K
    if original_max_len is None:
        raise ValueError("yarn scaling needs original_max_len, the context the model was trained on")

    def pair_of(turns: float) -> float:  # the pair that turns `turns` times over the original context
        return head_dim * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_of(32.0)), 0)
    high = min(math.ceil(pair_of(1.0)), head_dim // 2 - 1)
    ramp_K = jnp.clip((jnp.arange(head_dim // 2, dtype=jnp.float32) - low) / max(high - low, 1e-3), 0.0, 1.0)
    return inv_freq_K / factor * ramp_K + inv_freq_K * (1.0 - ramp_K)


def rope_attention_factor(scaling: str | None, factor: float) -> float:
    """What YaRN multiplies cos and sin by, on queries and keys: sqrt(1/t) = 0.1 ln(s) + 1; else 1."""
    return 0.1 * math.log(factor) + 1.0 if scaling == "yarn" and factor > 1.0 else 1.0


def rotate_half(x_BTNH: jax.Array, angles_BTK: jax.Array, scale_BTK: jax.Array | None = None) -> jax.Array:
    """Rotate channel pairs (i, i + H/2) of x by angles_BTK[..., i], times scale_BTK[..., i] if given.

    angles and scale are [T, K] or [B, T, K], K = H/2; the sum runs in float32.
    """
    h = x_BTNH.shape[-1]
    if h % 2:
        raise ValueError(f"rotary positions need an even head width, got {h}")
    if angles_BTK.ndim == 2:
        angles_BTK = angles_BTK[None]
    cos_BTK, sin_BTK = jnp.cos(angles_BTK), jnp.sin(angles_BTK)
    if scale_BTK is not None:
        scale_BTK = scale_BTK if scale_BTK.ndim == 3 else scale_BTK[None]
        cos_BTK, sin_BTK = cos_BTK * scale_BTK, sin_BTK * scale_BTK
    cos_BT1H = jnp.concatenate([cos_BTK] * 2, axis=-1)[:, :, None, :]
    sin_BT1H = jnp.concatenate([sin_BTK] * 2, axis=-1)[:, :, None, :]
    x32 = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos_BT1H + rotated * sin_BT1H).astype(x_BTNH.dtype)


def rope_angles(positions_T: jax.Array, head_dim: int, base: float = 10000.0, scaling: str | None = None,
                factor: float = 1.0, original_max_len: int | None = None) -> jax.Array:
    """angles_TK ([T] positions) or angles_BTK ([B, T]): position * inv_freq, positions / factor for "linear"."""
    positions = jnp.asarray(positions_T, jnp.float32)
    if scaling == "linear" and factor != 1.0:
        positions = positions / factor
    inv_freq_K = rope_inv_freq(head_dim, base, scaling, factor, original_max_len)
    return positions[..., None] * inv_freq_K.reshape((1,) * positions.ndim + (-1,))


def apply_rope(x_BTNH: jax.Array, positions_T: jax.Array, base: float = 10000.0, scaling: str | None = None,
               factor: float = 1.0, original_max_len: int | None = None) -> jax.Array:
    """Rotary embedding, rotate-half layout (GPT-NeoX, Llama), optionally scaled for longer contexts.

    Channel pairs (i, i + H/2) are rotated by the angle p * base^(-2i/H), so that
    <rope(q, m), rope(k, n)> depends on m - n only. `positions_T` is [T] or [B, T].
    `scaling` ("linear", "ntk", "yarn") with `factor` s > 1 stretches the context s
    times (see `rope_inv_freq`); YaRN also multiplies by `rope_attention_factor`.
    """
    angles_BTK = rope_angles(positions_T, x_BTNH.shape[-1], base, scaling, factor, original_max_len)
    mscale = rope_attention_factor(scaling, factor)
    return rotate_half(x_BTNH, angles_BTK, None if mscale == 1.0 else jnp.full_like(angles_BTK, mscale))


def xpos_zeta(head_dim: int) -> jax.Array:
    """zeta_K of xPos: zeta_i = (2i/H + 0.4) / 1.4, i.e. torchscale's (2i + 0.4 H) / (1.4 H)."""
    return (jnp.arange(0, head_dim, 2, dtype=jnp.float32) + 0.4 * head_dim) / (1.4 * head_dim)


def apply_xpos(x_BTNH: jax.Array, positions_T: jax.Array, base: float = 10000.0, scale_base: float = 512.0,
               downscale: bool = False, scaling: str | None = None, factor: float = 1.0,
               original_max_len: int | None = None) -> jax.Array:
    """xPos (Sun et al. 2022): RoPE times zeta_i^(p / scale_base), zeta_i^(-p / scale_base) if `downscale`.

    Queries at n take the scale, keys at m the downscale, so q . k is RoPE's, a function of
    n - m, times zeta^((n - m) / scale_base): a decay with distance for causal attention.
    `scaling` stretches the rotation as in `apply_rope`; the decay keeps the raw positions.
    Positions are absolute (torchscale centres them on the sequence: the same q . k).
    """
    angles_BTK = rope_angles(positions_T, x_BTNH.shape[-1], base, scaling, factor, original_max_len)
    power_BTK = jnp.asarray(positions_T, jnp.float32)[..., None] / (-scale_base if downscale else scale_base)
    zeta_BTK = xpos_zeta(x_BTNH.shape[-1]).reshape((1,) * (power_BTK.ndim - 1) + (-1,))
    scale_BTK = zeta_BTK ** power_BTK * rope_attention_factor(scaling, factor)
    return rotate_half(x_BTNH, angles_BTK, scale_BTK)


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


def alibi_bias(num_heads: int, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """[1, N, T, S] bias -slope_n * |q_pos - k_pos|.

    For causal attention this is the paper's slope * (k - q) on every key a query may
    see; the absolute value makes the same function serve bidirectional attention.
    """
    distance_TS = jnp.abs(
        jnp.asarray(q_positions, jnp.float32)[:, None] - jnp.asarray(k_positions, jnp.float32)[None, :]
    )
    return -alibi_slopes(num_heads)[None, :, None, None] * distance_TS[None, None]
