"""Layers rewritten for speed compute what the plain formulation computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax import GPTConfig, ops
from txjax.nn.layers import gelu


def test_gelu_hand_values():
    # x * Phi(x) with Phi from math.erf: Phi(1) = 0.841344746, Phi(-1) = 0.158655254
    x = jnp.array([-1.0, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(gelu(x), [-0.158655254, 0.0, 0.841344746, 2.995950157], rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.floats(-12.0, 12.0), st.floats(0.1, 4.0))
def test_gelu_matches_jax_exact_gelu_values_and_gradients(shift, spread):
    x = shift + spread * jnp.linspace(-3.0, 3.0, 257)
    np.testing.assert_allclose(gelu(x), jax.nn.gelu(x, approximate=False), atol=2e-6, rtol=1e-6)
    grad = jax.vmap(jax.grad(gelu))(x)
    ref = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(x)
    np.testing.assert_allclose(grad, ref, atol=2e-6)


@pytest.mark.parametrize("family,position", [("gpt", "alibi"), ("t5", "t5")])
def test_causal_blocks_in_the_model_change_nothing(family, position):
    """Query blocks of 2 (T = 7: 4 blocks) against one block: logits and every gradient,
    with a relative bias and left padding."""
    from txjax import T5, GPT, T5Config

    cls, cfg_cls = {"gpt": (GPT, GPTConfig), "t5": (T5, T5Config)}[family]
    base = dict(vocab_size=13, max_len=8, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                position=position, pad_id=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 7)), jnp.int32).at[1, :2].set(0)
    args = (tokens,) if family == "gpt" else (tokens, tokens)

    def loss_and_grads(block):
        model = cls(cfg_cls(**base, causal_block_size=block), rngs=nnx.Rngs(0))
        return nnx.jit(nnx.value_and_grad(lambda m: jnp.sum(jnp.tanh(m(*args)))))(model)

    def dots(block):  # the blocked model really runs more, smaller attention matmuls
        model = cls(cfg_cls(**base, causal_block_size=block), rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        return str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(*args))(state)).count("dot_general")

    assert dots(2) == dots(None) + 2 * 3 * base["num_layers"]  # 4 blocks: 3 more QK and 3 more PV per layer
    ref_loss, ref_grads = loss_and_grads(None)
    loss, grads = loss_and_grads(2)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, ref_grads)


def test_causal_block_size_is_validated():
    with pytest.raises(ValueError, match="causal_block_size"):
        GPTConfig(causal_block_size=0)
    assert GPTConfig(causal_block_size=None).causal_block_size is None
