"""The matmul gradients in the form XLA:CPU runs fast; chosen by `ExecutionConfig.grad_forms`.

Autodiff of y = x w writes dw = x^T dy, a dot that contracts the rows of its left operand
(the token axis). XLA:CPU gives that form to Eigen, or first copies the wider operand
transposed, while the plain [M, K] @ [K, N] form goes to its YNNPACK fusions. The custom
VJPs here (`matmul_nn`, `matmul_nt`, their weight-side gradient `matmul_tn`) copy the
*narrower* operand transposed (x^T, or dy^T and then transpose the small result) and never
leave the rows contracted. `dense` and `dot_product_attention` are `txjax.ops`' functions
with these matmuls (for attention: dk = dS^T q and dv = P^T dO); the values are the same,
only the backward pass's form differs. They are for float32 on XLA:CPU: for any other dtype
they return the plain ops' result (on GPU and TPU the transposed forms cost nothing, so
`txjax.nn` picks these only on the CPU; see txjax.config.ExecutionConfig).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from txjax.ops import attention, linear


def _float32(*xs: jax.Array) -> bool:
    return all(x.dtype == jnp.float32 for x in xs)


def swap_copy(x: jax.Array) -> jax.Array:
    """x's last two axes swapped as a real copy: the barriers keep XLA from folding the swap
    into the dot that makes x or the one that takes the copy (and so back into the slow form).
    Fencing both sides measured ~1-2% faster than fencing only the side that needs it."""
    barrier = jax.lax.optimization_barrier
    return barrier(jnp.swapaxes(barrier(x), -1, -2))


def matmul_tn(a_KM: jax.Array, b_KN: jax.Array) -> jax.Array:
    """a^T b, contracting the second-to-last axis of both (batch axes before it), as an
    [M, K] @ [K, N] dot: the narrower of a and b is copied transposed; when that is b, the
    product is taken as (b^T a)^T and its small [N, M] result transposed."""
    if a_KM.shape[-1] <= b_KN.shape[-1]:
        return jnp.einsum("...MK,...KN->...MN", swap_copy(a_KM), b_KN)
    return swap_copy(jnp.einsum("...NK,...KM->...NM", swap_copy(b_KN), a_KM))


@jax.custom_vjp
def matmul_nn(a_MK: jax.Array, b_KN: jax.Array) -> jax.Array:
    """a @ b; its gradient for b is `matmul_tn(a, d)`, not autodiff's a^T d."""
    return jnp.einsum("...MK,...KN->...MN", a_MK, b_KN)


def _nn_fwd(a_MK, b_KN):
    return matmul_nn(a_MK, b_KN), (a_MK, b_KN)


def _nn_bwd(res, d_MN):
    a_MK, b_KN = res
    return jnp.einsum("...MN,...KN->...MK", d_MN, b_KN), matmul_tn(a_MK, d_MN)


matmul_nn.defvjp(_nn_fwd, _nn_bwd)


@jax.custom_vjp
def matmul_nt(a_MK: jax.Array, b_NK: jax.Array) -> jax.Array:
    """a @ b^T; its gradient for b is `matmul_tn(d, a)`, not autodiff's d^T a."""
    return jnp.einsum("...MK,...NK->...MN", a_MK, b_NK)


def _nt_fwd(a_MK, b_NK):
    return matmul_nt(a_MK, b_NK), (a_MK, b_NK)


def _nt_bwd(res, d_MN):
    a_MK, b_NK = res
    return jnp.einsum("...MN,...NK->...MK", d_MN, b_NK), matmul_tn(d_MN, a_MK)


matmul_nt.defvjp(_nt_fwd, _nt_bwd)


def dense(x: jax.Array, kernel_DF: jax.Array, bias_F: jax.Array | None = None) -> jax.Array:
    """x [..., D] @ kernel [D, F] + bias [F], as `txjax.ops.dense`; in float32 the leading axes
    are flattened into one token axis M and the kernel's gradient is `matmul_tn`."""
    if not _float32(x, kernel_DF):
        return linear.dense(x, kernel_DF, bias_F)
    y = matmul_nn(x.reshape(-1, x.shape[-1]), kernel_DF).reshape(*x.shape[:-1], kernel_DF.shape[1])
    return y if bias_F is None else y + jnp.reshape(bias_F, (1,) * (y.ndim - 1) + (-1,))


def _pv(weights_BNTS: jax.Array, v_BNSH: jax.Array) -> jax.Array:
    return matmul_nn(weights_BNTS.astype(v_BNSH.dtype), v_BNSH)


def dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias=None, scale=None, implementation="reference",
                          causal_block_size=None) -> jax.Array:
    """`txjax.ops.dot_product_attention`, its reference formula with the custom-VJP matmuls."""
    if implementation != "reference" or not _float32(q_BTNH, k_BSNH, v_BSNH):
        return attention.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, implementation,
                                               causal_block_size)
    return attention.reference_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal_block_size,
                                         qk=matmul_nt, pv=_pv)
