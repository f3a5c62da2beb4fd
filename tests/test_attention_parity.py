"""Every attention implementation against the reference, for the masks and biases the models build.

tests/test_attention_impl.py covers square causal / padding / T5 / ALiBi cases; this adds
the rest of what the models feed attention: T5's bidirectional encoder bias with padding,
ALiBi with padding, cross-attention (T != S, padding only), a KV-cache decode step (one
query over S slots, causal + valid slots + relative bias), and bfloat16 inputs. "cudnn"
needs an NVIDIA GPU: on CPU it must fail with a clear message.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, GPTConfig, ops
from txjax.config import ExecutionConfig

B, T, S, N, H = 2, 5, 7, 4, 8


def qkv(t=T, s=S, dtype=jnp.float32, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(k1, (B, t, N, H)).astype(dtype),
            jax.random.normal(k2, (B, s, N, H)).astype(dtype),
            jax.random.normal(k3, (B, s, N, H)).astype(dtype))


def relative(q_pos, k_pos, bidirectional):
    table_KN = jax.random.normal(jax.random.key(9), (32, N))
    bucket = ops.t5_relative_position_bucket(k_pos[None, :] - q_pos[:, None], bidirectional)
    return jnp.transpose(table_KN[bucket], (2, 0, 1))[None]


def cases():
    """name -> (t, s, bias) as the models build them."""
    tokens_S = jnp.array([[3, 4, 5, 6, 0, 0, 0], [7, 8, 9, 10, 11, 12, 13]])
    tokens_T = tokens_S[:, :T]
    pad_T = ops.padding_mask(tokens_T, 0)
    pos_T, pos_S = jnp.arange(T), jnp.arange(S)
    # A decode step: query at position 4 over a cache of S slots; slots 0..4 written, slot 1 a pad.
    index = 4
    valid_BS = (pos_S <= index)[None, :] & jnp.array([[True, False] + [True] * (S - 2)] * B)
    causal_1S = (pos_S <= index)[None, None, None, :]
    return {
        "t5_encoder": (T, T, ops.mask_to_bias(pad_T) + relative(pos_T, pos_T, True)),
        "alibi+padding": (T, T, ops.mask_to_bias(ops.causal_mask(T) & pad_T)
                          + ops.alibi_bias(N, pos_T, pos_T)),
        "cross_attention": (T, S, ops.mask_to_bias(ops.padding_mask(tokens_S, 0))),
        "decode_step_t5": (1, S, ops.mask_to_bias(causal_1S & valid_BS[:, None, None, :])
                           + relative(jnp.array([index]), pos_S, False)),
        "decode_step_alibi": (1, S, ops.mask_to_bias(causal_1S & valid_BS[:, None, None, :])
                              + ops.alibi_bias(N, jnp.array([index]), pos_S)),
        "prefill_cache": (T, S, ops.mask_to_bias(ops.causal_mask(T, S))),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_xla_matches_reference_for_every_model_bias(name):
    t, s, bias = cases()[name]
    q, k, v = qkv(t, s)

    def run(impl):
        def loss(q, k, v, bias):
            out = ops.dot_product_attention(q, k, v, bias, implementation=impl)
            return jnp.sum(jnp.sin(out)), out
        return jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(q, k, v, bias)

    (_, ref), g_ref = run("reference")
    (_, xla), g_xla = run("xla")
    np.testing.assert_allclose(xla, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_xla, g_ref):  # q, k, v and the bias (the relative tables learn through it)
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["t5_encoder", "decode_step_alibi"])
def test_xla_matches_reference_in_bfloat16(name):
    t, s, bias = cases()[name]
    q, k, v = qkv(t, s, jnp.bfloat16)
    ref = ops.dot_product_attention(q, k, v, bias, implementation="reference")
    xla = ops.dot_product_attention(q, k, v, bias, implementation="xla")
    assert ref.dtype == xla.dtype == jnp.bfloat16
    exact = ops.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), bias)
    # Both round the weights or the output to bfloat16 (8 mantissa bits): ~1% of |v| ~ 1.
    for out in (ref, xla):
        np.testing.assert_allclose(out.astype(jnp.float32), exact, atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the refusal off GPU")
def test_cudnn_is_refused_clearly_off_gpu():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="'cudnn' needs an NVIDIA GPU"):
        ops.dot_product_attention(q, k, v, None, implementation="cudnn")
    config = GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                       dtype="bfloat16")
    model = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(attention_impl="cudnn"))
    with pytest.raises(ValueError, match="'cudnn' needs an NVIDIA GPU"):
        model(jnp.ones((1, 4), jnp.int32))
