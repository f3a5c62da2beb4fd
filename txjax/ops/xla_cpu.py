"""The matmuls of a train step in the forms XLA:CPU runs fast; chosen by `ExecutionConfig.grad_forms`.

What XLA:CPU does with dots (BUILD.md, "Measuring" and "CPU speed against PyTorch") shapes
everything here:

- It runs a dot fast (YNNPACK) only in the [M, K] @ [K, N] and [M, K] @ [N, K] forms.
  Autodiff of y = x w writes dw = x^T dy, a dot that contracts the rows of its left operand
  (the token axis), which XLA:CPU gives to Eigen or runs after copying the wider operand
  transposed. The custom VJPs here (`matmul_nn`, `matmul_nt`, their weight-side gradient
  `matmul_tn`) transpose the *narrower* operand (x^T, or dy^T and then transpose the
  small result) and never leave the rows contracted; a 2-D one by a CPU kernel (or an identity
  dot), so that XLA cannot fuse a layer norm into the transposing loop (`transposed`).
- A bfloat16 dot with a bfloat16 result is run as float32 x float32 (converted operands);
  only bfloat16 x bfloat16 -> float32 reaches the bfloat16 kernels (~2x the float32 rate on
  AVX512-BF16). So every dot here accumulates in float32 (`preferred_element_type`) and casts
  its result; gradients enter the backward dots in the operands' dtype, as under PyTorch's
  autocast. In float32 the casts are no-ops and the values those of the plain formulas.

`dense` and `dot_product_attention` are `txjax.ops`' functions with these matmuls (for
attention: dk = dS^T q and dv = P^T dO); only the backward pass's form differs. They take
float32 or bfloat16 operands (one dtype); for any other they return the plain ops' result.
On GPU and TPU the transposed forms cost nothing, so `txjax.nn` picks these only on the
CPU (see txjax.config.ExecutionConfig).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from txjax.ops import attention, cpu_kernels, linear

DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
"""The operand dtypes these forms are for."""


def supported(*xs: jax.Array) -> bool:
    """All of xs in one of `DTYPES`."""
    return len({x.dtype for x in xs}) == 1 and xs[0].dtype in DTYPES


def _dot(spec: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
    """einsum(spec, a, b) accumulated in float32, cast to out_dtype."""
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(out_dtype)


def _row_major_copy(x: jax.Array) -> jax.Array:
    """x as a row-major array even where it is a transposed view: XLA lays a transpose out as a
    relabelling of its operand's axes (a column-major view), and a bfloat16 dot with such an
    operand is converted to float32 x float32 before any later pass makes the copy. Flattened
    past a barrier, a view cannot stay one: the copy is made here."""
    return jax.lax.optimization_barrier(x.reshape(-1)).reshape(x.shape)


def swap_copy(x: jax.Array) -> jax.Array:
    """x's last two axes swapped as a real, row-major copy, which no XLA pass folds back into
    the dot that makes x or the one that takes it (the slow form again). The barriers fence
    both sides (~1-2% faster than one)."""
    return _row_major_copy(jnp.swapaxes(jax.lax.optimization_barrier(x), -1, -2))


EYE_TRANSPOSE_MAX = 512
"""Widest 2-D float32 operand `transposed` copies by an identity dot (measured: see its docstring)."""


def transposed(x_KM: jax.Array) -> jax.Array:
    """x^T, [..., M, K], for a weight gradient's narrower operand.

    As a copy (`swap_copy`), XLA fuses the elementwise work that produced x into the
    transposing loop and redoes it there with strided reads: a layer norm (QKV and FFN-in
    kernel gradients: 5-6 ms instead of 0.7 for [6304, 128]), or the residual stream's
    gradient, the sum of every later layer's norm backward (FFN-out at D = 384: up to 65 ms
    for one [384, 2048] copy, growing with depth). So a 2-D x goes to an operation whose
    operand XLA materializes, which does that work once:
    - on the CPU with txjax's kernels built, `cpu_kernels.transpose`, a plain copy;
    - else, for float32 at most `EYE_TRANSPOSE_MAX` wide, the dot I_M x^T, in the
      [M, M] @ [K, M]^T form YNNPACK runs fast. Exact: each element is 1 * x plus zeros
      (subnormals become 0, as in any XLA:CPU arithmetic; a non-finite x spreads NaN along its
      column, where the gradient is not finite anyway). It costs 2 M^2 K flops, at most the
      weight-gradient dot's own.
    Batched operands (attention's) keep the copy. Measured in BUILD.md (issue 22)."""
    if x_KM.ndim == 2 and x_KM.dtype in DTYPES and jax.default_backend() == "cpu" and cpu_kernels.available():
        return cpu_kernels.transpose(x_KM)
    if x_KM.ndim != 2 or x_KM.dtype != jnp.float32 or x_KM.shape[-1] > EYE_TRANSPOSE_MAX:
        return swap_copy(x_KM)
    eye_MM = jnp.eye(x_KM.shape[-1], dtype=x_KM.dtype)
    return _dot("MJ,KJ->MK", eye_MM, x_KM, x_KM.dtype)


SWAPPED_RESULT_COST = 8
"""What `matmul_tn` counts per element of a 2-D (weight-gradient) result it would transpose, against
one for each element of an operand it transposes: the swapped result's transpose is fused into the
optimizer's update, whose strided reads took ~2.7 ns an element against ~0.37 for the kernel's
transpose of an operand (BUILD.md, the larger config's bfloat16 step)."""


def matmul_tn(a_KM: jax.Array, b_KN: jax.Array, out_dtype=None) -> jax.Array:
    """a^T b, contracting the second-to-last axis of both (batch axes before it), as an
    [M, K] @ [K, N] dot: the narrower of a and b is `transposed`; when that is b, the
    product is taken as (b^T a)^T and its [N, M] result transposed, unless (2-D) transposing a
    costs less than b and the result together (`SWAPPED_RESULT_COST`)."""
    out_dtype = a_KM.dtype if out_dtype is None else out_dtype
    k, m, n = b_KN.shape[-2], a_KM.shape[-1], b_KN.shape[-1]
    if m <= n or (a_KM.ndim == 2 and k * m <= k * n + SWAPPED_RESULT_COST * m * n):
        return _dot("...MK,...KN->...MN", transposed(a_KM), b_KN, out_dtype)
    return swap_copy(_dot("...NK,...KM->...NM", transposed(b_KN), a_KM, out_dtype))


def _operands(a: jax.Array, b: jax.Array, dtype):
    """a and b as the dots' operands: in `dtype` (None: as they are) and row-major (`_operand`);
    with a `dtype`, a and b must be float32 (their gradients are)."""
    if dtype is None:
        return a, b
    if a.dtype != jnp.float32 or b.dtype != jnp.float32:
        raise ValueError(f"xla_cpu: a compute dtype takes float32 operands, got {a.dtype} and {b.dtype}")
    return _operand(a, dtype), _operand(b, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul_nn(a_MK: jax.Array, b_KN: jax.Array, out_dtype=None, dtype=None) -> jax.Array:
    """a @ b in out_dtype (default a's); its gradient for b is `matmul_tn(a, d)`, not autodiff's a^T d.

    `dtype` (default None: the operands' own): the dots' operand dtype for float32 a and b,
    cast to inside the VJP, so that their gradients come out of the dots' float32
    accumulators without a rounding to `dtype` (attention's bfloat16 path)."""
    return _nn_fwd(a_MK, b_KN, out_dtype, dtype)[0]


def _nn_fwd(a_MK, b_KN, out_dtype, dtype):
    a_MK, b_KN = res = _operands(a_MK, b_KN, dtype)
    return _dot("...MK,...KN->...MN", a_MK, b_KN, a_MK.dtype if out_dtype is None else out_dtype), res


def _nn_bwd(out_dtype, dtype, res, d_MN):
    a_MK, b_KN = res
    d_MN = d_MN.astype(a_MK.dtype)
    da_dtype, db_dtype = (a_MK.dtype, b_KN.dtype) if dtype is None else (jnp.float32, jnp.float32)
    return _dot("...MN,...KN->...MK", d_MN, b_KN, da_dtype), matmul_tn(a_MK, d_MN, db_dtype)


matmul_nn.defvjp(_nn_fwd, _nn_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul_nt(a_MK: jax.Array, b_NK: jax.Array, out_dtype=None, dtype=None) -> jax.Array:
    """a @ b^T in out_dtype (default a's), the operands in `dtype` as for `matmul_nn`; its
    gradient for b is `matmul_tn(d, a)`, not autodiff's d^T a."""
    return _nt_fwd(a_MK, b_NK, out_dtype, dtype)[0]


def _nt_fwd(a_MK, b_NK, out_dtype, dtype):
    a_MK, b_NK = res = _operands(a_MK, b_NK, dtype)
    return _dot("...MK,...NK->...MN", a_MK, b_NK, a_MK.dtype if out_dtype is None else out_dtype), res


def _nt_bwd(out_dtype, dtype, res, d_MN):
    a_MK, b_NK = res
    d_MN = d_MN.astype(a_MK.dtype)
    da_dtype, db_dtype = (a_MK.dtype, b_NK.dtype) if dtype is None else (jnp.float32, jnp.float32)
    return _dot("...MN,...NK->...MK", d_MN, b_NK, da_dtype), matmul_tn(d_MN, a_MK, db_dtype)


matmul_nt.defvjp(_nt_fwd, _nt_bwd)


def dense(x: jax.Array, kernel_DF: jax.Array, bias_F: jax.Array | None = None) -> jax.Array:
    """x [..., D] @ kernel [D, F] + bias [F], as `txjax.ops.dense`: the leading axes flattened
    into one token axis M, the kernel's gradient `matmul_tn`, the bias added (and its gradient
    summed) in float32 before the result is cast to x's dtype."""
    if not supported(x, kernel_DF):
        return linear.dense(x, kernel_DF, bias_F)
    y_MF = matmul_nn(x.reshape(-1, x.shape[-1]), kernel_DF, jnp.float32)
    if bias_F is not None:
        y_MF = y_MF + bias_F.astype(jnp.float32)[None, :]
    return y_MF.astype(x.dtype).reshape(*x.shape[:-1], kernel_DF.shape[1])


def _operand(x: jax.Array, dtype) -> jax.Array:
    """x in dtype as a dot's operand; in bfloat16 also a row-major copy where x was a transposed
    view (the heads-major q, k, v; see _row_major_copy). In float32 XLA makes that copy itself,
    later and cheaper (measured)."""
    x = x.astype(dtype)
    return x if x.dtype == jnp.float32 else _row_major_copy(x)


def dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias=None, scale=None, implementation="reference",
                          causal_block_size=None) -> jax.Array:
    """`txjax.ops.dot_product_attention`, its reference formula with the custom-VJP matmuls.

    In bfloat16, q, k and v enter the formula in float32 and are cast back only inside the
    matmuls' custom VJPs (their `dtype`): the heads-major copies, the causal blocks' slices
    and the sums of their key and value gradients then run in float32 (XLA:CPU has no
    bfloat16 arithmetic, and converted around every add they took 4x as long), each block's
    gradients reach those sums unrounded, and the scores, weights and output are accumulated
    in float32; only the output is cast to the inputs' dtype. (With the casts outside the
    VJPs, each block's gradients were rounded to bfloat16 and converted back: the bfloat16
    bench step was 7-8% slower, at D = 384 7-12%; BUILD.md.)"""
    if implementation != "reference" or not supported(q_BTNH, k_BSNH, v_BSNH):
        return attention.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, implementation,
                                               causal_block_size)
    dtype = q_BTNH.dtype

    def qk(q_BNTH, k_BNSH):
        return matmul_nt(q_BNTH, k_BNSH, jnp.float32, dtype)

    def pv(weights_BNTS, v_BNSH):
        return matmul_nn(weights_BNTS, v_BNSH, jnp.float32, dtype)

    q_BTNH, k_BSNH, v_BSNH = (x.astype(jnp.float32) for x in (q_BTNH, k_BSNH, v_BSNH))
    out_BTNH = attention.reference_attention(q_BTNH, k_BSNH, v_BSNH, bias, scale, causal_block_size,
                                             qk=qk, pv=pv)
    return out_BTNH.astype(dtype)
