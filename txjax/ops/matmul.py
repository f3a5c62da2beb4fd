"""Matmuls whose gradients XLA:CPU runs fast: the weight-side gradient in [M, K] @ [K, N] form.

Autodiff of y = x w writes dw = x^T dy, a dot that contracts the rows of its left operand
(the token axis). XLA:CPU gives that form to Eigen, or first copies the wider operand
transposed, while the plain [M, K] @ [K, N] form goes to its YNNPACK fusions. So on CPU in
float32 the custom VJPs here copy the *narrower* operand transposed (x^T, or dy^T and then
transpose the small result) and never leave the rows contracted. The attention matmuls in
`txjax.ops.attention` do the same for dk and dv. Elsewhere (GPU, TPU, other dtypes)
autodiff's gradient is kept: there the transposed forms cost nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cpu_nn_grads(*xs: jax.Array) -> bool:
    """Whether to use the custom VJPs: XLA:CPU, and every operand float32."""
    return jax.default_backend() == "cpu" and all(x.dtype == jnp.float32 for x in xs)


def swap_copy(x: jax.Array) -> jax.Array:
    """x's last two axes swapped as a real copy: the barriers keep XLA from folding the swap
    into the dot that makes x or the one that takes the copy (and so back into the slow form).
    Fencing both sides measured ~1-2% faster than fencing only the side that needs it."""
    barrier = jax.lax.optimization_barrier
    return barrier(jnp.swapaxes(barrier(x), -1, -2))


@jax.custom_vjp
def _matmul_f32(x_MD: jax.Array, w_DF: jax.Array) -> jax.Array:
    return x_MD @ w_DF


def _matmul_fwd(x_MD, w_DF):
    return _matmul_f32(x_MD, w_DF), (x_MD, w_DF)


def _matmul_bwd(res, dy_MF):
    x_MD, w_DF = res
    dx_MD = jnp.einsum("MF,DF->MD", dy_MF, w_DF)
    if x_MD.shape[1] <= dy_MF.shape[1]:
        dw_DF = jnp.einsum("DM,MF->DF", swap_copy(x_MD), dy_MF)
    else:  # dy is the narrower one: dw^T = dy^T x, and the small [F, D] result transposed
        dw_DF = swap_copy(jnp.einsum("FM,MD->FD", swap_copy(dy_MF), x_MD))
    return dx_MD, dw_DF


_matmul_f32.defvjp(_matmul_fwd, _matmul_bwd)


def dense(x: jax.Array, kernel_DF: jax.Array, bias_F: jax.Array | None = None) -> jax.Array:
    """x [..., D] @ kernel [D, F] + bias [F], as `nnx.Linear` computes it.

    On CPU in float32 the leading axes are flattened into one token axis M and the kernel's
    gradient is taken in the fast form (module docstring); the values are the same.
    """
    if cpu_nn_grads(x, kernel_DF):
        y = _matmul_f32(x.reshape(-1, x.shape[-1]), kernel_DF).reshape(*x.shape[:-1], kernel_DF.shape[1])
    else:
        y = jnp.einsum("...D,DF->...F", x, kernel_DF)
    return y if bias_F is None else y + jnp.reshape(bias_F, (1,) * (y.ndim - 1) + (-1,))
