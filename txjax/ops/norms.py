"""Layer norm and RMS norm, computed in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from txjax.ops.checks import check_float


def _check(x, scale, bias, name: str) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """x, scale, bias as arrays: x floating point, scale and bias [D] for x's width D."""
    x, scale = jnp.asarray(x), jnp.asarray(scale)
    bias = None if bias is None else jnp.asarray(bias)
    check_float(name, "x", x)
    if x.ndim == 0:
        raise ValueError(f"{name}: x must have a feature axis, got a scalar")
    for what, v in (("scale", scale), ("bias", bias)):
        if v is not None and v.shape != x.shape[-1:]:
            raise ValueError(f"{name}: {what} of shape {v.shape} does not fit input width {x.shape[-1]}")
    return x, scale, bias


def _lift(v: jax.Array, ndim: int) -> jax.Array:
    """[D] -> [1, ..., 1, D]: explicit broadcasting, so rank promotion can stay an error."""
    return jnp.reshape(v, (1,) * (ndim - 1) + (-1,))


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float = 1e-5) -> jax.Array:
    """(x - mean) / sqrt(var + eps) * scale + bias over the last axis.

    The variance is the biased one (divide by D), as in the notes and in PyTorch's
    `nn.LayerNorm`.
    """
    x, scale, bias = _check(x, scale, bias, "layer_norm")
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * _lift(scale, x.ndim)
    if bias is not None:
        y = y + _lift(bias, x.ndim)
    return y.astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale: no mean subtraction, no bias (T5, Llama)."""
    x, scale, _ = _check(x, scale, None, "rms_norm")
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps) * _lift(scale, x.ndim)
    return y.astype(x.dtype)
