"""The dense layer's formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dense(x: jax.Array, kernel_DF: jax.Array, bias_F: jax.Array | None = None) -> jax.Array:
    """x [..., D] @ kernel [D, F] + bias [F], as `nnx.Linear` computes it."""
    y = jnp.einsum("...D,DF->...F", x, kernel_DF)
    return y if bias_F is None else y + jnp.reshape(bias_F, (1,) * (y.ndim - 1) + (-1,))
