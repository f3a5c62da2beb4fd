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


def _recomputed_from_input(derivative):
    """An elementwise fn whose gradient dy * derivative(x) is recomputed from its input x.

    Autodiff would keep the forward's intermediates (GELU's erf, SiLU's sigmoid) as
    residuals: one more [B, T, F] array written in the forward pass and read in the
    backward, where recomputing them costs a few flops per element. The input is kept
    anyway (it is the preceding matmul's output), so the backward reads dy and x only.
    The barrier keeps XLA from sharing the backward's erf or sigmoid with the forward's
    (common subexpressions), which would bring the residual back.
    """

    def backward(x, dy):
        return (dy * derivative(jax.lax.optimization_barrier(x)),)

    def decorate(fn):
        wrapped = jax.custom_vjp(fn)
        wrapped.defvjp(lambda x: (fn(x), x), backward)
        return functools.wraps(fn)(wrapped)

    return decorate


_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _gelu_derivative(x):
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    return 0.5 * (1.0 + jax.lax.erf(x * _SQRT_HALF)) + x * _INV_SQRT_2PI * jnp.exp(-0.5 * x * x)


@_float32_math
@_recomputed_from_input(_gelu_derivative)
def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)).

    Written with erf, not `jax.nn.gelu`'s erfc(-x / sqrt 2): XLA lowers erf to one
    rational polynomial but erfc to two branches and an exp (in a CPU train-step
    profile the GELU fusions took ~5 ms each instead of ~11). Same values to ~1e-7
    (tested); for x < -6 the result is 0 instead of a number below 1e-8 in magnitude.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF))


@_float32_math
def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU's tanh approximation (GPT-2's "gelu_new")."""
    return jax.nn.gelu(x, approximate=True)


def _silu_derivative(x):
    """d/dx x sigmoid(x) = sigmoid(x) (1 + x (1 - sigmoid(x)))."""
    s = jax.nn.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


@_float32_math
@_recomputed_from_input(_silu_derivative)
def silu(x: jax.Array) -> jax.Array:
    """SiLU (swish), x * sigmoid(x): SwiGLU's activation."""
    return jax.nn.silu(x)


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "relu": jax.nn.relu, "silu": silu}
"""config.activation -> function; the one list of choices."""
