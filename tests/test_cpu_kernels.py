"""txjax's CPU kernel library (txjax.ops.cpu_kernels): the transpose the weight gradients use.
The fused attention, built into the same library, is tested in test_cpu_attention.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax.ops import cpu_kernels, xla_cpu

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler to build the kernels")


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 80), st.integers(0, 80), st.sampled_from([jnp.float32, jnp.bfloat16]), st.booleans())
def test_transpose_is_the_exact_transpose(k, m, dtype, jit):
    """Bit for bit, any shape (blocks of 32 and partial ones), both dtypes; a copy, so also
    subnormals, signed zeros, infinities and NaN."""
    x = jnp.asarray(np.random.default_rng(k * 100 + m).standard_normal((k, m)), dtype)
    if x.size:
        x = x.at[0, 0].set(1e-40).at[-1, -1].set(-0.0).at[0, -1].set(jnp.inf).at[-1, 0].set(jnp.nan)
    got = (jax.jit(cpu_kernels.transpose) if jit else cpu_kernels.transpose)(x)
    assert got.dtype == x.dtype and got.shape == (m, k)
    np.testing.assert_array_equal(np.asarray(got, np.float32).view(np.uint32),
                                  np.asarray(x, np.float32).T.view(np.uint32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(6304, 128), (1000, 600), (3, 5000), (4099, 131)])
def test_transpose_of_large_arrays_split_over_threads(shape, dtype):
    """Strips of 64 rows over the pool, 16 x 16 tiles inside them, and the edges of both."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu_kernels.transpose)(x), np.float32),
                                  np.asarray(x, np.float32).T)


def test_transpose_refuses_what_it_does_not_handle():
    with pytest.raises(ValueError, match="2-D"):
        cpu_kernels.transpose(jnp.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="2- or 4-byte"):
        cpu_kernels.transpose(jnp.zeros((2, 3), jnp.int8))


def test_transpose_under_vmap():
    x = jnp.arange(2 * 5 * 7, dtype=jnp.float32).reshape(2, 5, 7)
    np.testing.assert_array_equal(jax.vmap(cpu_kernels.transpose)(x), np.swapaxes(np.asarray(x), 1, 2))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_weight_gradients_transpose_with_the_kernel(dtype):
    """`xla_cpu.transposed` sends 2-D operands to the kernel (its operand is materialized, so no
    producer is fused into a transposing loop); batched ones (attention's) stay XLA copies."""
    two_d = jax.jit(xla_cpu.transposed).lower(jnp.zeros((64, 16), dtype)).compile().as_text()
    batched = jax.jit(xla_cpu.transposed).lower(jnp.zeros((2, 64, 16), dtype)).compile().as_text()
    assert 'custom_call_target="txjax_transpose"' in two_d
    assert "txjax_transpose" not in batched
