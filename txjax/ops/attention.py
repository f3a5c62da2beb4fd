"""Scaled dot-product attention with an additive bias, and the masks that feed it."""

from __future__ import annotations

import math

import einops
import jax
import jax.numpy as jnp
import numpy as np

from txjax.ops import cpu_attention
from txjax.ops.checks import check_float, is_concrete
from txjax.ops.positions import relative_positions


def causal_mask(t: int, s: int | None = None) -> jax.Array:
    """bool[1, 1, T, S]: query i may attend to key j iff j <= i + (S - T).

    With S == T (the default) this is the lower triangle of the notes' `torch.tril`.
    With S > T the T queries are the last T positions of the S keys, which is what
    a decoder sees when it appends T new tokens to S - T cached ones.
    """
    s = t if s is None else s
    if s < t:
        raise ValueError(f"causal_mask: key length {s} is shorter than query length {t}")
    q_T = jnp.arange(t)[:, None] + (s - t)
    k_S = jnp.arange(s)[None, :]
    return (k_S <= q_T)[None, None]


def padding_mask(tokens_BS: jax.Array, pad_id: int) -> jax.Array:
    """bool[B, 1, 1, S]: True at keys that are not padding."""
    if tokens_BS.ndim != 2:
        raise ValueError(f"padding_mask: tokens must be [B, S], got shape {tokens_BS.shape}")
    return (tokens_BS != pad_id)[:, None, None, :]


def attention_mask(q_positions_T: jax.Array, k_positions_S: jax.Array, *, causal: bool,
                   k_valid_BS: jax.Array | None = None, window: int | None = None,
                   q_documents_BT: jax.Array | None = None,
                   k_documents_BS: jax.Array | None = None) -> jax.Array | None:
    """bool[B|1, 1, T, S], True where query t may see key s; None when every key is visible.

    causal: key position <= query position (positions [T] and [S], or per row [B, T] and
    [B, S], increasing along each row). `window` W (sliding-window attention, in positions):
    causal, query q sees keys q - W < k <= q, the last W itself included; otherwise keys
    with |q - k| <= W. `k_valid_BS` False hides key s (padding, or a cache slot not yet
    written). `q_documents_BT` / `k_documents_BS` (packed sequences): query and key see each
    other only within one document id. Every self-attention mask of the models is built
    here, for a whole sequence and for T new tokens over a cache alike.
    """
    if window is not None and window < 1:
        raise ValueError(f"attention_mask: window must be >= 1 or None, got {window}")
    mask = None
    if causal or window is not None:
        offset_BTS = relative_positions(q_positions_T, k_positions_S)
        if causal:
            mask_BTS = offset_BTS <= 0 if window is None else (offset_BTS <= 0) & (offset_BTS > -window)
        else:
            mask_BTS = jnp.abs(offset_BTS) <= window
        mask = mask_BTS[:, None]
    if k_valid_BS is not None:
        valid_B11S = k_valid_BS[:, None, None, :]
        mask = valid_B11S if mask is None else mask & valid_B11S
    if (q_documents_BT is None) != (k_documents_BS is None):
        raise ValueError("attention_mask: give document ids for both queries and keys, or neither")
    if q_documents_BT is not None:
        same_B1TS = (q_documents_BT[:, :, None] == k_documents_BS[:, None, :])[:, None]
        mask = same_B1TS if mask is None else mask & same_B1TS
    return mask


def mask_to_bias(mask: jax.Array, dtype=jnp.float32) -> jax.Array:
    """0 where `mask` is True, exactly -inf where it is False."""
    return jnp.where(mask, jnp.zeros((), dtype), jnp.array(-jnp.inf, dtype))


def split_heads(x_BTD: jax.Array, num_heads: int) -> jax.Array:
    """[B, T, N*H] -> [B, T, N, H]."""
    return einops.rearrange(x_BTD, "B T (N H) -> B T N H", N=num_heads)


def merge_heads(x_BTNH: jax.Array) -> jax.Array:
    """[B, T, N, H] -> [B, T, N*H]."""
    return einops.rearrange(x_BTNH, "B T N H -> B T (N H)")


def _check_qk(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array | None = None, bias=None) -> None:
    """Shapes and dtypes: q [B, T, N, H], k and v [B, S, K, H] (K dividing N), all floating point;
    `bias` (if any) a float [B|1, N|1, T|1, S|1]. Rank 4 exactly: a [B, T, S] bias would
    broadcast as if its first axis were the heads."""
    check_float("attention", "q, k and v", *(x for x in (q_BTNH, k_BSKH, v_BSKH) if x is not None))
    if v_BSKH is not None and v_BSKH.shape != k_BSKH.shape:
        raise ValueError(f"attention: k {k_BSKH.shape} and v {v_BSKH.shape} must have one shape")
    if q_BTNH.ndim != 4 or k_BSKH.ndim != 4:
        raise ValueError(
            f"attention: q and k must be [B, T, N, H] and [B, S, K, H], "
            f"got {q_BTNH.shape} and {k_BSKH.shape}"
        )
    if (q_BTNH.shape[-1] != k_BSKH.shape[-1] or q_BTNH.shape[0] != k_BSKH.shape[0]
            or q_BTNH.shape[2] % k_BSKH.shape[2]):
        raise ValueError(
            f"attention: q {q_BTNH.shape} and k {k_BSKH.shape} disagree in batch or head width, "
            f"or k's heads do not divide q's"
        )
    if bias is None:
        return
    if bias.dtype == jnp.bool_:
        raise ValueError("attention: bias is boolean (a mask); pass ops.mask_to_bias(mask), which is 0 where "
                         "the mask is True and -inf where it is False")
    check_float("attention", "bias", bias)
    full = (q_BTNH.shape[0], q_BTNH.shape[2], q_BTNH.shape[1], k_BSKH.shape[1])
    if bias.ndim != 4 or any(d not in (1, f) for d, f in zip(bias.shape, full)):
        raise ValueError(f"attention: bias of shape {bias.shape} must be rank 4, [B|1, N|1, T|1, S|1] = "
                         f"[{'|1, '.join(map(str, full))}|1]")


def _check_block_size(causal_block_size) -> None:
    if causal_block_size is not None and (
            isinstance(causal_block_size, bool) or not isinstance(causal_block_size, int) or causal_block_size < 1):
        raise ValueError(f"attention: causal_block_size must be a positive int or None, got {causal_block_size!r}")


def _check_causal(bias: jax.Array | None, t: int, s: int, causal_block_size: int) -> None:
    """Blocks skip the keys after each query, so there must be as many keys as queries and the bias
    must hide the later ones: refused when it is None or (concrete) not -inf there; a traced bias is
    the caller's promise."""
    if s != t:
        raise ValueError(f"attention: causal blocks need as many keys as queries, got T={t}, S={s}")
    if bias is None:
        raise ValueError(f"attention: causal_block_size={causal_block_size} skips the keys after each query, "
                         "but bias is None; pass a causal bias (mask_to_bias(causal_mask(T)) + ...) or no blocks")
    if is_concrete(bias):
        later_TS = np.triu(np.ones((t, t), bool), 1)
        bias_BNTS = np.broadcast_to(np.asarray(bias), bias.shape[:2] + (t, t))
        if not np.all(bias_BNTS[..., later_TS] == -np.inf):
            raise ValueError(f"attention: causal_block_size={causal_block_size} needs a causal bias, but this one "
                             "is not -inf at every key after its query; blocks would change the result")


def scores(q_BNTH: jax.Array, k_BNSH: jax.Array) -> jax.Array:
    """q k^T per head, in float32: [B, N, T, S]."""
    return jnp.einsum("BNTH,BNSH->BNTS", q_BNTH, k_BNSH, preferred_element_type=jnp.float32)


def mix(weights_BNTS: jax.Array, v_BNSH: jax.Array) -> jax.Array:
    """The attention weights applied to the values: [B, N, T, H] in v's dtype."""
    return jnp.einsum("BNTS,BNSH->BNTH", weights_BNTS.astype(v_BNSH.dtype), v_BNSH)


def _softmax_weights(q_BNTH: jax.Array, k_BNSH: jax.Array, bias: jax.Array | None, scale: float,
                     qk=scores) -> jax.Array:
    """The weights from heads-major q and k: each head's [T, H] and [S, H] are contiguous."""
    scores_BNTS = qk(q_BNTH, k_BNSH) * scale
    if bias is not None:
        scores_BNTS = scores_BNTS + bias.astype(jnp.float32)
    max_BNT1 = jnp.max(scores_BNTS, axis=-1, keepdims=True, initial=-jnp.inf)  # -inf over no keys (S = 0)
    max_BNT1 = jax.lax.stop_gradient(jnp.where(jnp.isfinite(max_BNT1), max_BNT1, 0.0))
    exp_BNTS = jnp.exp(scores_BNTS - max_BNT1)
    denom_BNT1 = jnp.sum(exp_BNTS, axis=-1, keepdims=True)
    return exp_BNTS / jnp.where(denom_BNT1 == 0.0, 1.0, denom_BNT1)


def _group_queries(q_BNTH: jax.Array, k: int, bias: jax.Array | None):
    """Grouped-query attention without copying k or v: query head n = k·G + g uses key head k,
    so q [B, N, T, H] becomes [B, K, G·T, H] (a [B, K, G, T, H] view) and every group's
    G·T queries meet their one key head in a single batched matmul; `bias` follows."""
    b, n, t, h = q_BNTH.shape
    g = n // k
    q_BKMH = jnp.reshape(q_BNTH, (b, k, g * t, h))
    if bias is None or g == 1:
        return q_BKMH, bias
    bias = jnp.reshape(bias, (1,) * (4 - jnp.ndim(bias)) + jnp.shape(bias))
    bb, bn, bt, bs = bias.shape
    heads = (k, g) if bn == n else (1, 1)
    bias_BKGTS = jnp.reshape(bias, (bb, *heads, bt, bs))
    if heads == (1, 1) and bt == 1:
        return q_BKMH, bias_BKGTS[:, :, 0]
    bias_BKGTS = jnp.broadcast_to(bias_BKGTS, (bb, heads[0], g, t, bs))
    return q_BKMH, jnp.reshape(bias_BKGTS, (bb, heads[0], g * t, bs))


def _arrays(*xs):
    """jnp arrays (lists and NumPy arrays taken as such), None kept."""
    return tuple(None if x is None else jnp.asarray(x) for x in xs)


def _default_scale(q: jax.Array, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _heads_major(x_BTNH: jax.Array) -> jax.Array:
    return jnp.transpose(x_BTNH, (0, 2, 1, 3))


def attention_weights(
    q_BTNH: jax.Array,
    k_BSNH: jax.Array,
    bias: jax.Array | None = None,
    scale: float | None = None,
) -> jax.Array:
    """softmax(q k^T * scale + bias) over keys, float32, [B, N, T, S]; k may have K heads (GQA).

    A row whose every key is -inf gets all-zero weights instead of NaN, and its
    gradient is zero too: the row maximum is replaced by 0 where it is -inf and
    the denominator by 1 where it is 0, so no inf - inf or 0 / 0 is ever formed.
    """
    q_BTNH, k_BSNH, bias = _arrays(q_BTNH, k_BSNH, bias)
    _check_qk(q_BTNH, k_BSNH, bias=bias)
    b, t, n, _ = q_BTNH.shape
    q_BKMH, bias = _group_queries(_heads_major(q_BTNH), k_BSNH.shape[2], bias)
    weights_BKMS = _softmax_weights(q_BKMH, _heads_major(k_BSNH), bias, _default_scale(q_BTNH, scale))
    return jnp.reshape(weights_BKMS, (b, n, t, -1))


IMPLEMENTATIONS = ("reference", "xla", "cudnn", "cpu_fused")
"""The `implementation` choices of `dot_product_attention` (ExecutionConfig.attention_impl adds "auto")."""


def _block_bias(bias_BNTS: jax.Array, t0: int, t1: int) -> jax.Array:
    """bias[:, :, t0:t1, :t1] on the query and key axes that are not broadcast (size 1)."""
    rows = slice(t0, t1) if bias_BNTS.shape[2] > 1 else slice(None)
    cols = slice(0, t1) if bias_BNTS.shape[3] > 1 else slice(None)
    return bias_BNTS[:, :, rows, cols]


def causal_block_bounds(t: int, block_size: int) -> list[int]:
    """Query block edges 0 = b_0 < b_1 < ... = t, as even as possible, about `block_size` apart."""
    blocks = -(-t // block_size)
    return [round(t * i / blocks) for i in range(blocks + 1)]


def dot_product_attention(
    q_BTNH: jax.Array,
    k_BSNH: jax.Array,
    v_BSNH: jax.Array,
    bias: jax.Array | None = None,
    scale: float | None = None,
    implementation: str = "reference",
    causal_block_size: int | None = None,
) -> jax.Array:
    """softmax(q k^T / sqrt(H) + bias) v -> out_BTNH.

    k and v may have fewer heads K than q's N (grouped-query attention, K dividing N):
    query head n then uses key/value head n // (N / K), as if each were repeated.

    `bias` is additive, rank 4 and broadcastable to [B, N, T, S]: any sum of
    `mask_to_bias(causal & padding)`, a T5 relative bias and an ALiBi bias.
    `scale` defaults to 1/sqrt(H); T5 checkpoints use 1.0. Softmax runs in
    float32; the output has v's dtype. `implementation`: "reference" (the
    formula written out here, `reference_attention`), "xla" / "cudnn"
    (`jax.nn.dot_product_attention`) or "cpu_fused" (`txjax.ops.cpu_attention`: one fused
    kernel per direction, float32, the CPU only; built with the system's C++ compiler).

    `causal_block_size`: the caller promises the bias hides every key after its
    query (causal, S == T). The queries are then cut into blocks of about this
    size and each block attends only to the keys up to its last query, so the
    fully masked blocks above the diagonal are never computed: with k blocks,
    (k + 1) / 2k of the scores, softmax and their gradients. Same result (masked
    keys weigh exactly 0); only the order of float additions can differ. A bias that is None,
    or concrete and not -inf above the diagonal, is refused; a traced one is trusted.

    Refused with a ValueError: non-float q, k, v or bias, a boolean bias (a mask: pass
    `mask_to_bias(mask)`), a bias not of rank 4 [B|1, N|1, T|1, S|1]. No keys at all (S = 0)
    give zeros, as a fully masked row does.
    """
    q_BTNH, k_BSNH, v_BSNH, bias = _arrays(q_BTNH, k_BSNH, v_BSNH, bias)
    _check_block_size(causal_block_size)
    if implementation in ("xla", "cudnn"):
        _check_qk(q_BTNH, k_BSNH, v_BSNH, bias)
        if causal_block_size is not None and q_BTNH.shape[1] > causal_block_size:
            bounds = causal_block_bounds(q_BTNH.shape[1], causal_block_size)
            return _causal_blocks(bounds, q_BTNH, k_BSNH, v_BSNH, bias, lambda q, k, v, b: (
                xla_dot_product_attention(q, k, v, b, scale, implementation)), axis=1, size=causal_block_size)
        return xla_dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, implementation)
    if implementation == "cpu_fused":
        return _cpu_fused(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal_block_size)
    if implementation != "reference":
        raise ValueError(f"attention implementation {implementation!r} is not one of {IMPLEMENTATIONS}")
    return reference_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal_block_size)


def reference_attention(q_BTNH, k_BSNH, v_BSNH, bias=None, scale=None, causal_block_size=None, *,
                        qk=scores, pv=mix) -> jax.Array:
    """The formula, with q k^T and P v as `qk` and `pv` (txjax.ops.xla_cpu passes its own forms).

    q, k, v move to heads-major [B, N, T, H] once, so that every head's matrices are
    contiguous for the batched matmuls (XLA:CPU ran `BNTS,BSNH->BTNH` on the strided
    layout at half speed). With K < N key heads the queries are grouped (`_group_queries`).
    """
    q_BTNH, k_BSNH, v_BSNH, bias = _arrays(q_BTNH, k_BSNH, v_BSNH, bias)
    _check_block_size(causal_block_size)
    _check_qk(q_BTNH, k_BSNH, v_BSNH, bias)
    scale = _default_scale(q_BTNH, scale)
    q_BNTH, k_BKSH, v_BKSH = (_heads_major(x) for x in (q_BTNH, k_BSNH, v_BSNH))

    def attend(q_BNTH, k_BKSH, v_BKSH, bias):
        b, n, t, h = q_BNTH.shape
        q_BKMH, bias = _group_queries(q_BNTH, k_BKSH.shape[1], bias)
        out_BKMH = pv(_softmax_weights(q_BKMH, k_BKSH, bias, scale, qk), v_BKSH)
        return jnp.reshape(out_BKMH, (b, n, t, h))

    t = q_BTNH.shape[1]
    if causal_block_size is not None and t > causal_block_size:
        out_BNTH = _causal_blocks(causal_block_bounds(t, causal_block_size),
                                  q_BNTH, k_BKSH, v_BKSH, bias, attend, axis=2, size=causal_block_size)
    else:
        out_BNTH = attend(q_BNTH, k_BKSH, v_BKSH, bias)
    return _heads_major(out_BNTH)


def _cpu_fused(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal_block_size) -> jax.Array:
    """The fused CPU kernel; a `causal_block_size` is the same promise as for blocks (the bias hides
    every later key, S == T), and the kernel then skips those keys whatever the block size."""
    _check_qk(q_BTNH, k_BSNH, v_BSNH, bias)
    if causal_block_size is not None:
        _check_causal(bias, q_BTNH.shape[1], k_BSNH.shape[1], causal_block_size)
    return cpu_attention.attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal=causal_block_size is not None)


def _causal_blocks(bounds, q, k, v, bias, attend, axis: int, size: int) -> jax.Array:
    """attend() per query block [t0, t1) over keys [0, t1), concatenated; T is `axis`."""
    _check_causal(bias, q.shape[axis], k.shape[axis], size)
    take = lambda x, a, b: jax.lax.slice_in_dim(x, a, b, axis=axis)
    outs = [
        attend(take(q, t0, t1), take(k, 0, t1), take(v, 0, t1),
               None if bias is None else _block_bias(bias, t0, t1))
        for t0, t1 in zip(bounds[:-1], bounds[1:])
    ]
    return jnp.concatenate(outs, axis=axis)


def xla_dot_product_attention(
    q_BTNH: jax.Array,
    k_BSNH: jax.Array,
    v_BSNH: jax.Array,
    bias: jax.Array | None = None,
    scale: float | None = None,
    implementation: str = "xla",
) -> jax.Array:
    """The same contract through `jax.nn.dot_product_attention(implementation=...)`.

    jax wants a finite bias and a boolean mask, and gives a fully masked row the
    mean of the values; so the -inf entries of `bias` become the mask, the rest
    the bias, and rows with no visible key are zeroed (value and gradient).
    "cudnn" is cuDNN's fused (flash) kernel: NVIDIA GPUs only, float16 / bfloat16
    inputs; on any other backend it is refused here with a clear error instead of
    failing inside XLA.
    """
    if implementation == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"attention implementation 'cudnn' needs an NVIDIA GPU, but the backend is "
            f"{jax.default_backend()!r}; use 'xla' or 'reference'"
        )
    if bias is None:
        return jax.nn.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, scale=scale,
                                            implementation=implementation)
    # cuDNN wants the bias in the inputs' dtype; XLA adds it to float32 scores.
    bias = jnp.asarray(bias, q_BTNH.dtype if implementation == "cudnn" else jnp.float32)
    bias = jnp.reshape(bias, (1,) * (4 - bias.ndim) + bias.shape)
    mask = bias != -jnp.inf
    finite = jnp.where(mask, bias, 0.0)
    out_BTNH = jax.nn.dot_product_attention(
        q_BTNH, k_BSNH, v_BSNH, bias=finite, mask=mask, scale=scale, implementation=implementation
    )
    visible_BNT = jnp.any(mask, axis=-1)
    visible_BTN1 = jnp.transpose(visible_BNT, (0, 2, 1))[..., None]
    return jnp.where(visible_BTN1, out_BTNH, jnp.zeros((), out_BTNH.dtype))
