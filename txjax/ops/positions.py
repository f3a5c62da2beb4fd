"""Positional encodings as pure functions: sinusoidal, RoPE (and its scalings), xPos, T5 buckets,
ALiBi, FIRE, KERPLE, randomized positions.

The relative biases (ALiBi, FIRE, KERPLE) use the distance |i - j|: for causal
attention this is the papers' i - j on every key a query may see, and it makes the
same function the symmetric form for bidirectional attention. FIRE and KERPLE take
their parameter values as arguments (the NNX module owns the parameters), positions
as [T] / [S] or per row [B, T] / [B, S], and return a bias [1 or B, N, T, S].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

KERPLE_VARIANTS = ("log", "power")


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


def check_rotary_positions(name: str, x_BTNH: jax.Array, positions) -> None:
    """ValueError unless positions are [T] or [B|1, T] for x [B, T, N, H]: one per token."""
    shape = jnp.shape(positions)
    b, t = x_BTNH.shape[:2] if x_BTNH.ndim == 4 else (None, None)
    if x_BTNH.ndim != 4 or not (shape == (t,) or (len(shape) == 2 and shape[1] == t and shape[0] in (1, b))):
        raise ValueError(f"{name}: positions of shape {shape} do not fit x of shape {x_BTNH.shape}: "
                         f"expected [T] = [{t}] or [B|1, T] = [{b}|1, {t}] (x is [B, T, N, H])")


def apply_rope(x_BTNH: jax.Array, positions_T: jax.Array, base: float = 10000.0, scaling: str | None = None,
               factor: float = 1.0, original_max_len: int | None = None) -> jax.Array:
    """Rotary embedding, rotate-half layout (GPT-NeoX, Llama), optionally scaled for longer contexts.

    Channel pairs (i, i + H/2) are rotated by the angle p * base^(-2i/H), so that
    <rope(q, m), rope(k, n)> depends on m - n only. `positions_T` is [T] or [B, T].
    `scaling` ("linear", "ntk", "yarn") with `factor` s > 1 stretches the context s
    times (see `rope_inv_freq`); YaRN also multiplies by `rope_attention_factor`.
    """
    check_rotary_positions("apply_rope", x_BTNH, positions_T)
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
    check_rotary_positions("apply_xpos", x_BTNH, positions_T)
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
    num_buckets must be an int >= 4 and max_distance must exceed max_exact (num_buckets // 4
    bidirectional, // 2 otherwise): log(max_distance / max_exact) divides the log buckets.
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 4:
        raise ValueError(f"t5_relative_position_bucket: num_buckets must be an int >= 4, got {num_buckets!r}")
    per = 4 if bidirectional else 2
    if not max_distance > num_buckets // per:
        raise ValueError(f"t5_relative_position_bucket: max_distance={max_distance} must exceed the exact-offset "
                         f"range {num_buckets // per} (num_buckets // {per}"
                         f"{' when bidirectional' if per == 4 else ''})")
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
    """key_pos - query_pos, [1 or B, T, S], from positions [T] / [S] or per row [B, T] / [B, S]."""
    q_BT, k_BS = jnp.atleast_2d(jnp.asarray(q_positions)), jnp.atleast_2d(jnp.asarray(k_positions))
    return k_BS[:, None, :] - q_BT[:, :, None]


def random_offsets(offset_BTS: jax.Array, distances_BR: jax.Array | None) -> jax.Array:
    """The offsets key_pos - query_pos with row b's offset r = +-|r| moved to +-distances_BR[b, |r|]
    (`random_distances`: Ruoss et al.'s random distance per offset), the sign kept; the offsets
    themselves when distances_BR is None. [B, T, S] from [1 or B, T, S]."""
    if distances_BR is None:
        return offset_BTS
    rows_B11 = jnp.arange(distances_BR.shape[0])[:, None, None]
    distance_BTS = distances_BR[rows_B11, jnp.abs(offset_BTS)]
    return jnp.where(offset_BTS < 0, -distance_BTS, distance_BTS)


def document_positions(document_ids_BT: jax.Array) -> jax.Array:
    """int32 [B, T]: each token's position within its document, restarting at 0 wherever the id
    changes along a row (packed sequences: each document one contiguous run)."""
    ids_BT = jnp.asarray(document_ids_BT)
    t_BT = jnp.broadcast_to(jnp.arange(ids_BT.shape[-1], dtype=jnp.int32), ids_BT.shape)
    starts_BT = jnp.concatenate([jnp.ones_like(ids_BT[:, :1], bool), ids_BT[:, 1:] != ids_BT[:, :-1]], axis=1)
    return t_BT - jax.lax.cummax(jnp.where(starts_BT, t_BT, 0), axis=1)


def alibi_bias(num_heads: int, q_positions: jax.Array, k_positions: jax.Array,
               directional: bool = False, distances_BR: jax.Array | None = None) -> jax.Array:
    """[1, N, T, S] bias -slope_n * |q_pos - k_pos| ([B, N, T, S] for per-row positions).

    For causal attention this is the paper's slope * (k - q) on every key a query may
    see; the absolute value makes the same function serve bidirectional attention.
    `directional` (an encoder): keys before the query get slope_n / 2 more, as Ruoss et al.'s
    code does "to break the symmetry (otherwise, the model cannot distinguish left and right)".
    distances_BR (`random_distances`): row b's distance at offset |q_pos - k_pos| = r is
    distances_BR[b, r] instead of r; the bias is then [B, N, T, S].
    """
    offset_BTS = relative_positions(q_positions, k_positions)
    distance_BTS = jnp.abs(random_offsets(offset_BTS, distances_BR)).astype(jnp.float32)
    if directional:
        distance_BTS = distance_BTS - 0.5 * (offset_BTS < 0)
    return -alibi_slopes(num_heads)[None, :, None, None] * distance_BTS[:, None]


def random_positions(key: jax.Array, batch: int, length: int, max_position: int,
                     lengths_B: jax.Array | None = None, shared: bool = False) -> jax.Array:
    """int32 [B, T]: per row, T distinct positions drawn uniformly from [0, max_position), sorted.

    Ruoss et al. 2023 ("Randomized Positional Encodings Boost Length Generalization"): trained
    on such positions, a model has seen every position up to max_position, not only 0..T-1.
    lengths_B (a padded batch): row b's first lengths_B[b] entries are a sorted uniform subset of
    that size, as if the row were drawn alone (the first k of T sorted draws would not be: they
    crowd low positions); the entries after them are 0. shared: one draw for the whole batch (Ruoss
    et al.'s code draws per batch): rows of the same length get the same positions.
    """
    if length > max_position:
        raise ValueError(f"random_positions: {length} tokens need max_position >= {length}, got {max_position}")
    # The indices of the `length` smallest of max_position uniform draws, smallest first: argsort's
    # first `length` (top_k keeps its tie order, lower index first) without sorting all of them.
    ranks_BT = jax.lax.top_k(-jax.random.uniform(key, (1 if shared else batch, max_position)), length)[1]
    ranks_BT = jnp.broadcast_to(ranks_BT, (batch, length))
    if lengths_B is None:
        return jnp.sort(ranks_BT, axis=-1).astype(jnp.int32)
    # The first k entries of a random permutation are a uniform k-subset; the rest sort after them.
    kept_BT = jnp.arange(length)[None, :] < jnp.asarray(lengths_B)[:, None]
    sorted_BT = jnp.sort(jnp.where(kept_BT, ranks_BT, max_position), axis=-1)
    return jnp.where(kept_BT, sorted_BT, 0).astype(jnp.int32)


def random_distances(key: jax.Array, batch: int, length: int, max_distance: int,
                     lengths_B: jax.Array | None = None, shared: bool = False) -> jax.Array:
    """int32 [B, T]: per row, the distance at each offset r = |i - j|: 0 at r = 0, then T - 1
    distinct distances drawn uniformly from [1, max_distance), sorted.

    Ruoss et al.'s code's random ALiBi (`compute_noisy_alibi_encodings_biases`): the distance of
    two tokens is a function of their offset alone, the same for every query of a row, where
    random positions (`random_positions`) give each pair of tokens its own. lengths_B (a padded
    batch): row b's offsets 1 .. lengths_B[b] - 1 are drawn as if the row were alone; the entries
    after them are 0 (only pads sit that far apart). shared: one draw for the batch, as their code.
    """
    if length > max_distance:
        raise ValueError(f"random_distances: {length} tokens need max_distance >= {length}, got {max_distance}")
    offsets_B = None if lengths_B is None else jnp.maximum(jnp.asarray(lengths_B) - 1, 0)
    drawn_BR = random_positions(key, batch, length - 1, max_distance - 1, offsets_B, shared) + 1
    if offsets_B is not None:
        drawn_BR = jnp.where(jnp.arange(length - 1)[None, :] < offsets_B[:, None], drawn_BR, 0)
    return jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), drawn_BR], axis=1)


def _query_key_BTS(q_positions: jax.Array, k_positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Query and key positions as float32 [1 or B, T, 1] and [1 or B, 1, S]."""
    q_BT = jnp.atleast_2d(jnp.asarray(q_positions, jnp.float32))
    k_BS = jnp.atleast_2d(jnp.asarray(k_positions, jnp.float32))
    return q_BT[:, :, None], k_BS[:, None, :]


def fire_bias(
    q_positions: jax.Array,
    k_positions: jax.Array,
    w1_1W: jax.Array | None,
    b1_W: jax.Array | None,
    w2_WN: jax.Array,
    b2_N: jax.Array,
    c: jax.Array,
    threshold: jax.Array,
    eps: float = 1e-6,
    directional: bool = False,
) -> jax.Array:
    """FIRE (Li et al. 2023): b(i, j) = f(psi(|i - j|) / psi(max(L, i, j))), [1 or B, N, T, S].

    psi(x) = log(|c| x + 1) amplifies local differences; dividing by psi of the later
    position ("progressive interpolation") maps every distance into [0, 1], so longer
    inputs reuse the range seen in training; the threshold L keeps short prefixes from
    being stretched over it. f is the MLP 1 -> W (ReLU) -> N, or, with w1 and b1 None, the linear
    map 1 -> N (w2 is then [1, N]: one weight and bias per head). max(L, i, j) is the paper's
    max(L, i) on every causal key (j <= i), symmetric in i and j for an encoder.
    `directional`: a key after the query (j > i) gives f the negated input, so an encoder can tell
    the two directions apart; keys at or before it are the paper's.
    `eps` keeps the denominator off zero when L and the positions are all 0.
    """
    q_BT1, k_B1S = _query_key_BTS(q_positions, k_positions)
    scale = jnp.abs(c)
    distance_BTS = jnp.abs(q_BT1 - k_B1S)
    normalizer_BTS = jnp.maximum(jnp.maximum(q_BT1, k_B1S), threshold)
    x_BTS = jnp.log1p(scale * distance_BTS) / (jnp.log1p(scale * normalizer_BTS) + eps)
    if directional:
        x_BTS = jnp.where(k_B1S > q_BT1, -x_BTS, x_BTS)
    if w1_1W is None:
        hidden_BTSW = x_BTS[..., None]
    else:
        hidden_BTSW = jax.nn.relu(x_BTS[..., None] * w1_1W[None, None] + b1_W[None, None, None])
    bias_BTSN = hidden_BTSW @ w2_WN + b2_N[None, None, None]
    return jnp.moveaxis(bias_BTSN, -1, 1)


def kerple_bias(
    q_positions: jax.Array,
    k_positions: jax.Array,
    r1_N: jax.Array,
    r2_N: jax.Array,
    variant: str = "log",
    distances_BR: jax.Array | None = None,
) -> jax.Array:
    """KERPLE (Chi et al. 2022) bias [1 or B, N, T, S] from positive per-head r1, r2.

    log:   -r1 * log(1 + r2 |i - j|)   (the paper's best variant)
    power: -r1 * |i - j|^r2, 0 < r2 <= 2 (a conditionally positive definite kernel)
    r1 and r2 are [N], the same both ways, or [2, N] per direction: row 0 for keys at or before
    the query (the paper's causal form), row 1 for keys after it. distances_BR
    (`random_distances`): |i - j| = r is distances_BR[b, r] instead (`random_offsets`).
    """
    if variant not in KERPLE_VARIANTS:
        raise ValueError(f"kerple_bias: variant={variant!r} is not one of {KERPLE_VARIANTS}")
    offset_BTS = relative_positions(q_positions, k_positions)
    offset_B1TS = offset_BTS[:, None]
    distance_B1TS = jnp.abs(random_offsets(offset_BTS, distances_BR)).astype(jnp.float32)[:, None]
    r1_1N11, r2_1N11 = (_per_direction(jnp.asarray(r, jnp.float32), offset_B1TS) for r in (r1_N, r2_N))
    if variant == "log":
        return -r1_1N11 * jnp.log1p(r2_1N11 * distance_B1TS)
    # 0^r2 = 0; the where keeps d/dr2 of 0^r2 (0 * log 0) out of the gradient.
    positive_B1TS = distance_B1TS > 0
    safe_B1TS = jnp.where(positive_B1TS, distance_B1TS, 1.0)
    return -r1_1N11 * jnp.where(positive_B1TS, safe_B1TS ** r2_1N11, 0.0)


def _per_direction(r: jax.Array, offset_B1TS: jax.Array) -> jax.Array:
    """A per-head value [N] as [1, N, 1, 1]; a per-direction one [2, N] chosen by the sign of
    key - query (row 1 for keys after the query) as [B, N, T, S]."""
    if r.ndim == 1:
        return r[None, :, None, None]
    return jnp.where(offset_B1TS > 0, r[1][None, :, None, None], r[0][None, :, None, None])
