"""Layer norm and RMS norm for the CPU: `cpu_norm.cc`, called through XLA's FFI.

XLA:CPU runs a norm and its gradient as several passes over the [M, D] activations, and its
reductions take the [D] scale as a materialized [M, D] broadcast (BUILD.md, "The norms"). The
kernels make one pass each way, a row at a time in cache, and save the row's mean and 1/std for
the backward pass. The math is `txjax.ops.layer_norm` and `txjax.ops.rms_norm` (float32 work,
the output in x's dtype); only the order of the float sums differs. x of float32 or bfloat16;
other dtypes get the plain ops. Built with txjax's other CPU kernels (`txjax.ops.cpu_kernels`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from txjax.ops import norms
from txjax.ops.cpu_kernels import DTYPES, register


def _forward(x, scale, bias, eps: float, center: bool):
    rows = jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)
    return jax.ffi.ffi_call("txjax_norm_forward", (jax.ShapeDtypeStruct(x.shape, x.dtype), rows, rows),
                            vmap_method="sequential")(x, scale, bias, eps=np.float32(eps), center=np.int32(center))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _norm(x, scale, bias, eps: float, center: bool):
    return _forward(x, scale, bias, eps, center)[0]


def _norm_fwd(x, scale, bias, eps, center):
    y, mean, rstd = _forward(x, scale, bias, eps, center)
    return y, (x, scale, mean, rstd)


def _norm_bwd(eps, center, res, dy):
    x, scale, mean, rstd = res
    vector = jax.ShapeDtypeStruct(scale.shape, jnp.float32)
    return jax.ffi.ffi_call("txjax_norm_backward", (jax.ShapeDtypeStruct(x.shape, x.dtype), vector, vector),
                            vmap_method="sequential")(x, scale, mean, rstd, dy.astype(x.dtype), center=np.int32(center))


_norm.defvjp(_norm_fwd, _norm_bwd)


def _fused(x, scale, bias, eps: float, center: bool):
    register()
    bias = jnp.zeros_like(scale, jnp.float32) if bias is None else bias.astype(jnp.float32)
    return _norm(x, scale.astype(jnp.float32), bias, float(eps), center)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float = 1e-5) -> jax.Array:
    """`txjax.ops.layer_norm` by the kernels."""
    x, scale, bias = norms._check(x, scale, bias, "layer_norm")
    if x.dtype not in DTYPES or x.size == 0:
        return norms.layer_norm(x, scale, bias, eps)
    return _fused(x, scale, bias, eps, True)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`txjax.ops.rms_norm` by the kernels."""
    x, scale, _ = norms._check(x, scale, None, "rms_norm")
    if x.dtype not in DTYPES or x.size == 0:
        return norms.rms_norm(x, scale, eps)
    return _fused(x, scale, None, eps, False)
