"""The CPU activation kernels (txjax.ops.cpu_activation) against txjax.ops.activations and against
the formulas themselves: values and gradients, any shape, both dtypes; and the models with
activation_impl="cpu_fused" against "reference"."""

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

from test_cpu_attention import assert_models_match
from txjax import GPT, GPTConfig
from txjax.config import ExecutionConfig
from txjax.ops import activations, cpu_activation, cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler to build the kernels")

KINDS = sorted(cpu_activation.KINDS)
TOL = {jnp.float32: dict(atol=5e-6, rtol=5e-6), jnp.bfloat16: dict(atol=1e-2, rtol=1e-2)}  # bf16: one rounding apart


def _value_and_grad(fn, x, dy):
    y, vjp = jax.vjp(fn, x)
    return y, vjp(dy)[0]


def _check(shape, dtype, kind, jit, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape) * 4, dtype)
    dy = jnp.asarray(rng.standard_normal(shape), dtype)
    run = jax.jit(_value_and_grad, static_argnums=0) if jit else _value_and_grad
    y, dx = run(cpu_activation.FUSED[kind], x, dy)
    y_ref, dx_ref = jax.jit(_value_and_grad, static_argnums=0)(activations.ACTIVATIONS[kind], x, dy)
    assert y.dtype == dx.dtype == x.dtype and y.shape == dx.shape == x.shape
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_allclose(f32(y), f32(y_ref), **TOL[dtype])
    np.testing.assert_allclose(f32(dx), f32(dx_ref), **TOL[dtype])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 70),
       st.sampled_from([jnp.float32, jnp.bfloat16]), st.sampled_from(KINDS), st.booleans())
def test_matches_the_reference_property(lead, d, dtype, kind, jit):
    """Sizes of whole vectors of 16 and not (the tail), both dtypes, jit or not."""
    _check((*lead, d), dtype, kind, jit)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_large_arrays_split_into_chunks(kind, dtype):
    """100,003 elements: six chunks of 16,384 over the threads and a tail of 3."""
    _check((7, 14286, 1), dtype, kind, True)


# The formulas in float64: GELU x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, and its derivative
# Phi(x) + x phi(x); SiLU x s(x), s(x) = 1 / (1 + e^-x), and s(x) (1 + x (1 - s(x))).
def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


FORMULAS = {
    "gelu": (lambda x: x * _phi(x), lambda x: _phi(x) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
    "silu": (lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))),
}


@pytest.mark.parametrize("kind", KINDS)
def test_float32_values_and_derivatives_are_the_formulas(kind):
    """Within a few float32 ulp of the formula over [-12, 12] (erf and exp are polynomials)."""
    xs = np.linspace(-12, 12, 4801, dtype=np.float32)
    y, dx = jax.jit(_value_and_grad, static_argnums=0)(cpu_activation.FUSED[kind], jnp.asarray(xs), jnp.ones_like(xs))
    f, df = FORMULAS[kind]
    np.testing.assert_allclose(y, [f(float(x)) for x in xs], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(dx, [df(float(x)) for x in xs], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_special_values_are_those_of_the_reference(kind):
    """NaN stays NaN, +inf stays +inf, large negative inputs give (signed) zero, as the plain ops."""
    x = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30, -50.0], jnp.float32)
    y, dx = _value_and_grad(cpu_activation.FUSED[kind], x, jnp.ones_like(x))
    y_ref, dx_ref = _value_and_grad(activations.ACTIVATIONS[kind], x, jnp.ones_like(x))
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-6, atol=1e-30)


def test_other_dtypes_and_empty_arrays_take_the_plain_functions():
    x16 = jnp.asarray(np.random.default_rng(0).standard_normal((3, 8)), jnp.float16)
    for kind in KINDS:
        np.testing.assert_array_equal(cpu_activation.FUSED[kind](x16), activations.ACTIVATIONS[kind](x16))
        assert cpu_activation.FUSED[kind](jnp.zeros((0, 8))).shape == (0, 8)


def test_vmap_runs_each_element():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 5, 16)), jnp.float32)
    np.testing.assert_allclose(jax.vmap(cpu_activation.FUSED["gelu"])(x), activations.gelu(x), atol=2e-6)


def test_only_the_kernels_activations_are_replaced():
    assert cpu_activation.activation("gelu", fused=True) is cpu_activation.FUSED["gelu"]
    assert cpu_activation.activation("gelu", fused=False) is activations.gelu
    assert cpu_activation.activation("relu", fused=True) is activations.ACTIVATIONS["relu"]


@pytest.mark.parametrize("family,fields", [("gpt", {}), ("gpt", dict(gated=True, activation="silu")),
                                           ("bert", {}), ("t5", dict(activation="gelu"))])
def test_models_match_the_reference_activations(family, fields):
    assert_models_match(family, ExecutionConfig(activation_impl="cpu_fused"),
                        ExecutionConfig(activation_impl="reference"), **fields)


def test_auto_picks_the_kernel_for_bfloat16_on_the_cpu_only():
    """In float32 XLA fuses the activation with the bias add, which is faster (BUILD.md)."""
    assert ExecutionConfig().activation("cpu", "bfloat16") == "cpu_fused"
    assert ExecutionConfig().activation("cpu", "float32") == "reference"
    assert ExecutionConfig().activation("gpu", "bfloat16") == "reference"
    assert ExecutionConfig(activation_impl="cpu_fused").activation("cpu", "float32") == "cpu_fused"
    assert ExecutionConfig(activation_impl="reference").activation("cpu", "bfloat16") == "reference"
    with pytest.raises(ValueError, match="activation_impl"):
        ExecutionConfig(activation_impl="fast")
    config = GPTConfig(vocab_size=8, max_len=4, d_model=16, num_heads=2, num_layers=1, d_ff=32, dtype="bfloat16")
    assert GPT(config, rngs=nnx.Rngs(0)).decoder.blocks[0].ffn.fused_activation
    reference = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(activation_impl="reference"))
    assert not reference.decoder.blocks[0].ffn.fused_activation
