"""Fused attention for the CPU: `cpu_attention.cc`, called through XLA's FFI.

XLA:CPU runs attention as separate ops: heads-major copies of q, k and v, the [B, N, T, S]
scores written to memory between the two matmuls, the softmax in between, the same again in
the backward pass (BUILD.md, issue 22: 42 ms of a layer's forward and backward at the bench
config on one core, PyTorch's fused kernel 29). The kernel does one (batch row, key head) at a
time in per-thread scratch that stays in cache, reads q, k, v in their [B, T, N, H] layout,
computes only the lower triangle of causal self-attention, and recomputes the weights in the
backward pass from the saved log-sum-exp, as FlashAttention does. It computes in float32
whatever the inputs' dtype, except that bfloat16 heads 32 or more wide on a CPU with bfloat16
products (`bf16_heads`: AMX tiles, or AVX512-BF16's vdpbf16ps) run their six products with
bfloat16 operands and float32 sums, the weights P and the scores' gradient dS rounded to bfloat16
before their products (FlashAttention's and PyTorch's bfloat16 recipe; the softmax and dS itself
stay float32). It returns the bias's gradient only when the bias is being differentiated (a T5,
FIRE or KERPLE bias; not a mask).

The kernel is built with txjax's other CPU kernels (`txjax.ops.cpu_kernels`: on first use, with
the system's C++ compiler); `cpu_kernels.available()` says whether that worked.
`ExecutionConfig(attention_impl="cpu_fused")` chooses this path, and "auto" does on the CPU
when it is available.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from txjax.ops import cpu_kernels
from txjax.ops.cpu_kernels import register


def bf16_heads(head_width: int) -> bool:
    """Whether bfloat16 heads this wide run their products in bfloat16 here
    (`cpu_kernels.bf16_min_head`)."""
    return 0 < cpu_kernels.bf16_min_head() <= head_width


def _call(name: str, results, *args, **attrs):
    attrs = {k: np.float32(v) if isinstance(v, float) else np.int32(v) for k, v in attrs.items()}
    return jax.ffi.ffi_call(f"txjax_attention_{name}", results, vmap_method="sequential")(*args, **attrs)


def _forward(q, k, v, bias, scale, causal, has_bias):
    b, t, n, _ = q.shape
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32))
    return _call("forward", results, q, k, v, bias, scale=scale, causal=causal, has_bias=has_bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(q_BTNH, k_BSKH, v_BSKH, bias_BNTS, scale: float, causal: bool, has_bias: bool):
    return _forward(q_BTNH, k_BSKH, v_BSKH, bias_BNTS, scale, causal, has_bias)[0]


def _attention_fwd(q, k, v, bias, scale, causal, has_bias):
    values = [x.value for x in (q, k, v, bias)]
    out, lse = _forward(*values, scale, causal, has_bias)
    return out, (*values, out, lse, has_bias and bias.perturbed)


def _attention_bwd(scale, causal, has_bias, res, d_out):
    q, k, v, bias, out, lse, bias_grad = res
    b, t, n, _ = q.shape
    dbias_shape = (b, n, t, k.shape[1]) if bias_grad else (1, 1, 1, 1)
    results = tuple(jax.ShapeDtypeStruct(s, d) for s, d in ((q.shape, q.dtype), (k.shape, q.dtype), (v.shape, q.dtype),
                                                           (dbias_shape, jnp.float32)))
    if isinstance(d_out, jax.custom_derivatives.SymbolicZero):
        d_out = jnp.zeros_like(out)
    dq, dk, dv, dbias = _call("backward", results, q, k, v, bias, out, lse, d_out, scale=scale, causal=causal,
                              has_bias=has_bias, bias_grad=bias_grad)
    if not bias_grad:
        return dq, dk, dv, None
    return dq, dk, dv, jnp.sum(dbias, axis=tuple(i for i, d in enumerate(bias.shape) if d == 1), keepdims=True)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, bias: jax.Array | None = None,
              scale: float | None = None, causal: bool = False) -> jax.Array:
    """softmax(q k^T * scale + bias) v, the contract of `txjax.ops.dot_product_attention`.

    `causal`: the caller promises the bias hides every key after its query (S == T), and the
    kernel skips them. The bias is taken as float32 [B|1, N|1, T, S]; q, k, v are computed in
    float32 (or with bfloat16 products: the module's docstring) and the output has v's dtype.
    bfloat16 q, k and v are read and their output and gradients written in bfloat16 by the kernel
    itself (rounded once, as XLA's converts would), except with grouped queries, whose key
    gradients sum over the group in float32. Builds the kernels on first use (`cpu_kernels.build`).
    """
    register()
    b, t, n, h = q_BTNH.shape
    s = k_BSKH.shape[1]
    scale = 1.0 / math.sqrt(h) if scale is None else float(scale)
    if t == 0 or s == 0:
        return jnp.zeros((b, t, n, h), v_BSKH.dtype)
    bf16 = {x.dtype for x in (q_BTNH, k_BSKH, v_BSKH)} == {jnp.dtype(jnp.bfloat16)} and k_BSKH.shape[2] == n
    q, k, v = (x.astype(jnp.bfloat16 if bf16 else jnp.float32) for x in (q_BTNH, k_BSKH, v_BSKH))
    has_bias = bias is not None
    if has_bias:
        bias = jnp.asarray(bias, jnp.float32)
        bias = jnp.broadcast_to(bias, bias.shape[:2] + (t, s))
    else:  # the kernel reads nothing of it
        bias = jnp.zeros((1, 1, 1, 1), jnp.float32)
    return _attention(q, k, v, bias, scale, bool(causal), has_bias).astype(v_BSKH.dtype)
