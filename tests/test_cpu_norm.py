"""The CPU norm kernels (txjax.ops.cpu_norm) against txjax.ops.layer_norm and rms_norm: values and
the gradients of x, the scale and the bias, any shape and width; and the models with
norm_impl="cpu_fused" against "reference"."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

from test_cpu_attention import assert_models_match
from txjax import GPT, GPTConfig, ops
from txjax.config import ExecutionConfig
from txjax.ops import cpu_kernels, cpu_norm

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler to build the kernels")

TOL = {jnp.float32: dict(atol=2e-5, rtol=2e-5), jnp.bfloat16: dict(atol=2e-2, rtol=2e-2)}  # bf16: one rounding apart


def _pair(kind: str, bias: bool):
    """(kernel, reference) as functions of (x, scale, bias)."""
    if kind == "rms":
        return (lambda x, s, b: cpu_norm.rms_norm(x, s)), (lambda x, s, b: ops.rms_norm(x, s))
    b = (lambda v: v) if bias else (lambda v: None)
    return (lambda x, s, v: cpu_norm.layer_norm(x, s, b(v))), (lambda x, s, v: ops.layer_norm(x, s, b(v)))


def _value_and_grads(fn, x, scale, bias, dy):
    y, vjp = jax.vjp(fn, x, scale, bias)
    return y, vjp(dy)


def _check(shape, dtype, kind, bias, jit, seed=0):
    rng = np.random.default_rng(seed)
    d = shape[-1]
    x = jnp.asarray(rng.standard_normal(shape) * 2 + 0.5, dtype)
    scale, bias_v = (jnp.asarray(rng.standard_normal(d), jnp.float32) for _ in range(2))
    dy = jnp.asarray(rng.standard_normal(shape), dtype)
    kernel, reference = _pair(kind, bias)
    run = jax.jit(_value_and_grads, static_argnums=0) if jit else _value_and_grads
    y, grads = run(kernel, x, scale, bias_v, dy)
    y_ref, grads_ref = jax.jit(_value_and_grads, static_argnums=0)(reference, x, scale, bias_v, dy)
    assert y.dtype == x.dtype and y.shape == x.shape and grads[0].dtype == x.dtype
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_allclose(f32(y), f32(y_ref), **TOL[dtype])
    np.testing.assert_allclose(f32(grads[0]), f32(grads_ref[0]), **TOL[dtype])
    # The scale's and bias's gradients sum over every row, in float32 in both.
    np.testing.assert_allclose(grads[1], grads_ref[1], atol=1e-4 * np.sqrt(x.size / d), rtol=1e-4)
    np.testing.assert_allclose(grads[2], grads_ref[2], atol=1e-4 * np.sqrt(x.size / d), rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 80),
       st.sampled_from([jnp.float32, jnp.bfloat16]), st.sampled_from(["layer", "rms"]), st.booleans(), st.booleans())
def test_matches_the_reference_property(lead, d, dtype, kind, bias, jit):
    """Widths of whole vectors of 16 and not, one row or several, both dtypes, with and without bias."""
    _check((*lead, d), dtype, kind, bias, jit)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_many_rows_split_into_parts(kind):
    """1,000 rows of 128: 16 parts of 64 rows whose column sums add up in order."""
    _check((10, 100, 128), jnp.float32, kind, True, True)


def test_a_constant_row_normalizes_to_the_bias_with_finite_gradients():
    x = jnp.full((2, 3, 32), 7.0)
    scale, bias = jnp.full((32,), 2.0), jnp.arange(32.0)
    y, grads = _value_and_grads(lambda x, s, b: cpu_norm.layer_norm(x, s, b), x, scale, bias, jnp.ones_like(x))
    np.testing.assert_allclose(y, jnp.broadcast_to(bias, x.shape), atol=1e-6)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_other_dtypes_and_empty_arrays_take_the_plain_ops():
    x16 = jnp.asarray(np.random.default_rng(0).standard_normal((3, 8)), jnp.float16)
    np.testing.assert_array_equal(cpu_norm.layer_norm(x16, jnp.ones(8), jnp.zeros(8)),
                                  ops.layer_norm(x16, jnp.ones(8), jnp.zeros(8)))
    assert cpu_norm.rms_norm(jnp.zeros((0, 8)), jnp.ones(8)).shape == (0, 8)


def test_shapes_are_checked_as_by_the_reference():
    with pytest.raises(ValueError, match="does not fit"):
        cpu_norm.layer_norm(jnp.zeros((2, 8)), jnp.ones(4), None)


def test_vmap_runs_each_element():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 5, 16)), jnp.float32)
    np.testing.assert_allclose(jax.vmap(lambda r: cpu_norm.rms_norm(r, jnp.ones(16)))(x),
                               ops.rms_norm(x, jnp.ones(16)), atol=1e-6)


@pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
def test_models_match_the_reference_norms(family):
    """GPT and BERT: layer norms; T5: RMS norms."""
    assert_models_match(family, ExecutionConfig(norm_impl="cpu_fused"), ExecutionConfig(norm_impl="reference"))


def test_the_execution_config_picks_the_kernel_on_the_cpu_only():
    assert ExecutionConfig().norm("cpu") == "cpu_fused"
    assert ExecutionConfig().norm("gpu") == "reference"
    assert ExecutionConfig(norm_impl="reference").norm("cpu") == "reference"
    with pytest.raises(ValueError, match="norm_impl"):
        ExecutionConfig(norm_impl="fast")
    config = GPTConfig(vocab_size=8, max_len=4, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    assert GPT(config, rngs=nnx.Rngs(0)).decoder.final_norm.fused
    assert not GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(norm_impl="reference")).decoder.final_norm.fused
