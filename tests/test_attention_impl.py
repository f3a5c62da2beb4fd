"""attention_impl="xla" (jax.nn.dot_product_attention) agrees with the reference attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, ops
from txjax.config import ExecutionConfig
from txjax.ops import xla_cpu

B, T, N, H = 2, 7, 4, 8


def qkv(seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    shape = (B, T, N, H)
    return (jax.random.normal(k1, shape), jax.random.normal(k2, shape), jax.random.normal(k3, shape))


def t5_bias():
    table_KN = jax.random.normal(jax.random.key(5), (32, N))
    pos = jnp.arange(T)
    bucket_TS = ops.t5_relative_position_bucket(pos[None, :] - pos[:, None], bidirectional=False)
    return jnp.transpose(table_KN[bucket_TS], (2, 0, 1))[None]


def biases():
    tokens = jnp.array([[3, 4, 5, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])  # row 2: every key is padding
    causal = ops.mask_to_bias(ops.causal_mask(T))
    padding = ops.mask_to_bias(ops.padding_mask(tokens, 0))
    alibi = ops.alibi_bias(N, jnp.arange(T), jnp.arange(T))
    return {
        "none": None,
        "causal": causal,
        "padding": padding,
        "causal+padding": ops.mask_to_bias(ops.causal_mask(T) & ops.padding_mask(tokens, 0)),
        "t5": causal + t5_bias(),
        "alibi": causal + alibi,
    }


@pytest.mark.parametrize("name", list(biases()))
def test_xla_matches_reference_values_and_gradients(name):
    bias = biases()[name]
    q, k, v = qkv()

    def loss(impl, q, k, v):
        out = ops.dot_product_attention(q, k, v, bias, implementation=impl)
        return jnp.sum(out * jnp.cos(jnp.arange(H, dtype=jnp.float32)).reshape(1, 1, 1, H)), out

    def grads(impl):
        return jax.jit(jax.value_and_grad(lambda *a: loss(impl, *a), (0, 1, 2), has_aux=True))(q, k, v)

    (_, out_ref), g_ref = grads("reference")
    (_, out_xla), g_xla = grads("xla")
    np.testing.assert_allclose(out_xla, out_ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_xla, g_ref):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    if name == "padding":  # the all-padding sequence attends to nothing: zeros, not NaN
        np.testing.assert_array_equal(out_xla[1], 0.0)


def test_unknown_implementation_is_an_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="not one of"):
        ops.dot_product_attention(q, k, v, implementation="flash")
    with pytest.raises(ValueError, match="attention_impl"):
        ExecutionConfig(attention_impl="flash")


@pytest.mark.slow
@pytest.mark.parametrize("position", ["learned", "alibi", "rope"])
def test_gpt_logits_agree_across_implementations(position):
    config = GPTConfig(vocab_size=13, max_len=T, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                       position=position, pad_id=0)
    tokens = jnp.array([[1, 2, 3, 4, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11]])
    ref = GPT(config, rngs=nnx.Rngs(0))(tokens)
    xla = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(attention_impl="xla"))(tokens)
    np.testing.assert_allclose(xla, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_t5_logits_agree_across_implementations():
    config = T5Config(vocab_size=13, max_len=T, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    enc = jnp.array([[3, 4, 5, 1, 0, 0, 0], [6, 7, 8, 9, 10, 11, 1]])
    dec = jnp.array([[0, 3, 4, 5], [0, 6, 7, 8]])
    ref = T5(config, rngs=nnx.Rngs(0))(enc, dec)
    xla = T5(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(attention_impl="xla"))(enc, dec)
    np.testing.assert_allclose(xla, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["causal", "causal+padding", "t5", "alibi"])
@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_causal_blocks_skip_only_masked_keys(name, impl):
    """Blocked causal attention equals the full one, values and gradients (incl. the bias's)."""
    bias = biases()[name]
    q, k, v = qkv(1)

    def loss(q, k, v, bias, block):
        out = ops.dot_product_attention(q, k, v, bias, implementation=impl, causal_block_size=block)
        return jnp.sum(out * jnp.sin(jnp.arange(H, dtype=jnp.float32)).reshape(1, 1, 1, H))

    grad = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3)), static_argnums=4)
    full_loss, full = grad(q, k, v, bias, None)
    for block in (2, 3):  # 4 and 3 query blocks of T = 7
        blocked_loss, blocked = grad(q, k, v, bias, block)
        np.testing.assert_allclose(blocked_loss, full_loss, rtol=1e-5)
        for a, b in zip(blocked, full):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_causal_blocks_need_square_attention():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="as many keys"):
        ops.dot_product_attention(q[:, :3], k, v, causal_block_size=2)


@pytest.mark.parametrize("name,block,jit", [("none", None, True), ("padding", None, True), ("t5", None, True),
                                            ("causal", 3, True), ("t5", 3, True), ("t5", 3, False)])
def test_cpu_key_and_value_gradients_equal_autodiff(name, block, jit):
    """ops.xla_cpu's custom VJPs (dk^T = q^T dS, dv^T = dO^T P) give autodiff's gradients of the
    plain formula in txjax.ops, and the same values."""
    bias = biases()[name]
    q, k, v = qkv(2)
    w = jnp.cos(jnp.arange(B * T * N * H, dtype=jnp.float32)).reshape(B, T, N, H)

    def grads(attention):
        f = jax.value_and_grad(lambda q, k, v, bias: jnp.sum(w * attention(
            q, k, v, bias, causal_block_size=block)), (0, 1, 2, 3) if bias is not None else (0, 1, 2))
        return (jax.jit(f) if jit else f)(q, k, v, bias)

    (custom_value, custom), (plain_value, plain) = grads(xla_cpu.dot_product_attention), grads(ops.dot_product_attention)
    np.testing.assert_allclose(custom_value, plain_value, rtol=1e-6)
    for a, b in zip(custom, plain):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_cpu_attention_gradient_numerically():
    """Against central differences, not against another gradient we wrote."""
    from jax.test_util import check_grads

    q, k, v = (x[:1, :5, :2, :4] for x in qkv(3))
    bias = ops.mask_to_bias(ops.causal_mask(5))
    check_grads(lambda q, k, v: xla_cpu.dot_product_attention(q, k, v, bias, causal_block_size=2),
                (q, k, v), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def test_cpu_attention_in_bfloat16_accumulates_in_float32_with_bfloat16_dots():
    """bfloat16 q, k, v: the output and gradients are the float32 formula's on the same numbers
    (to bfloat16's precision), the causal blocks' gradient sums run in float32, and every dot,
    forward and backward, in every block, is bfloat16 x bfloat16 -> float32."""
    from tests.hlo_dots import dots

    t = 16
    q, k, v = (jax.random.normal(jax.random.key(i), (B, t, N, H)) for i in range(3))
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    bias = ops.mask_to_bias(ops.causal_mask(t))
    w = jnp.cos(jnp.arange(B * t * N * H, dtype=jnp.float32)).reshape(B, t, N, H)

    def value_and_grads(attention, *qkv):
        f = jax.value_and_grad(lambda q, k, v: jnp.sum(w * attention(
            q, k, v, bias, causal_block_size=8).astype(jnp.float32)), (0, 1, 2))
        return jax.jit(f)(*qkv)

    out = xla_cpu.dot_product_attention(q, k, v, bias, causal_block_size=8)
    assert out.dtype == jnp.bfloat16
    exact = ops.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), bias)
    np.testing.assert_allclose(out.astype(jnp.float32), exact, rtol=2e-2, atol=2e-2)
    (_, grads), (_, exact_grads) = (value_and_grads(xla_cpu.dot_product_attention, q, k, v),
                                    value_and_grads(ops.dot_product_attention,
                                                    *(x.astype(jnp.float32) for x in (q, k, v))))
    for g, e in zip(grads, exact_grads):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(jnp.float32), e, rtol=5e-2, atol=5e-2)

    grad = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(xla_cpu.dot_product_attention(
        q, k, v, bias, causal_block_size=8).astype(jnp.float32) ** 2), (0, 1, 2)))
    found = dots(grad.lower(q, k, v).compile().as_text())  # 2 query blocks x (2 forward + 4 backward)
    assert len(found) == 2 * 6 and all(d[:3] == ("f32", "bf16", "bf16") for d in found), found


def test_cpu_attention_gradient_dots_all_contract_the_left_operands_last_axis():
    """What the custom VJPs are for: no batched dot in the compiled gradient contracts the query
    axis of its left operand (the form XLA:CPU hands to Eigen at a third of YNNPACK's speed)."""
    import re

    q, k, v = qkv(4)
    bias = ops.mask_to_bias(ops.causal_mask(T))
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(xla_cpu.dot_product_attention(
        q, k, v, bias, causal_block_size=3) ** 2), (0, 1, 2)))
    hlo = grad.lower(q, k, v).compile().as_text()
    lhs_contracting = re.findall(r" dot\(.*lhs_contracting_dims=\{(\d+)\}", hlo)
    assert len(lhs_contracting) == 3 * 6  # 3 query blocks x (2 forward + 4 backward dots)
    assert set(lhs_contracting) == {"3"}
