"""Feed-forward activations, by the name a config gives them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _float32_math(fn):
    """fn computed in float32 and returned in x's dtype, as norms and softmax are: a bfloat16
    or float16 input is rounded once, at the end, not after every elementwise op (and XLA:CPU,
    which has no bfloat16 arithmetic, converts once instead of around each op)."""

    @functools.wraps(fn)
    def wrapped(x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        narrow = x.dtype in (jnp.bfloat16, jnp.float16)
        return fn(x.astype(jnp.float32) if narrow else x).astype(x.dtype)

    return wrapped


@_float32_math
def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)).

    Written with erf, not `jax.nn.gelu`'s erfc(-x / sqrt 2): XLA lowers erf to one
    rational polynomial but erfc to two branches and an exp (in a CPU train-step
    profile the GELU fusions took ~5 ms each instead of ~11). Same values to ~1e-7
    (tested); for x < -6 the result is 0 instead of a number below 1e-8 in magnitude.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * 0.7071067811865476))


@_float32_math
def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU's tanh approximation (GPT-2's "gelu_new")."""
    return jax.nn.gelu(x, approximate=True)


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "relu": jax.nn.relu, "silu": _float32_math(jax.nn.silu)}
"""config.activation -> function; the one list of choices."""
