"""Layers rewritten for speed compute what the plain formulation computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax import GPTConfig
from txjax.config import ExecutionConfig
from txjax.nn.layers import Dense
from txjax.ops import gelu, xla_cpu


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


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["gelu", "silu"]), st.floats(-30.0, 30.0), st.floats(0.1, 8.0), st.booleans())
def test_activation_gradients_recomputed_from_the_input_are_autodiffs(name, shift, spread, jit):
    """GELU and SiLU keep only their input for the backward pass and recompute the derivative
    there (Phi + x phi; sigmoid (1 + x (1 - sigmoid))): the same gradient as autodiff of the
    plain formula, to float32 rounding, jitted or not, and under a second grad (the VJP is
    differentiable)."""
    from txjax.ops import ACTIVATIONS

    plain = {"gelu": lambda v: 0.5 * v * (1.0 + jax.lax.erf(v / np.sqrt(2.0))),
             "silu": lambda v: v * jax.nn.sigmoid(v)}[name]
    x = shift + spread * jnp.linspace(-3.0, 3.0, 129)
    grad = jax.vmap(jax.grad(ACTIVATIONS[name]))
    np.testing.assert_allclose((jax.jit(grad) if jit else grad)(x), jax.vmap(jax.grad(plain))(x), atol=2e-6, rtol=1e-6)
    second = jax.vmap(jax.grad(jax.grad(ACTIVATIONS[name])))(x)
    np.testing.assert_allclose(second, jax.vmap(jax.grad(jax.grad(plain)))(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_activations_of_narrow_floats_are_computed_in_float32(name, dtype):
    """One rounding, at the end: the float32 value rounded, and its gradient likewise."""
    from txjax.ops import ACTIVATIONS

    fn = ACTIVATIONS[name]
    x = jnp.linspace(-5.0, 5.0, 513).astype(dtype)
    y = fn(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, fn(x.astype(jnp.float32)).astype(dtype))
    grad = jax.vmap(jax.grad(lambda v: fn(v).astype(jnp.float32)))(x)
    exact = jax.vmap(jax.grad(fn))(x.astype(jnp.float32)).astype(dtype)
    np.testing.assert_array_equal(grad, exact)


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
        model = cls(cfg_cls(**base), rngs=nnx.Rngs(0),
                    execution=ExecutionConfig(attention_impl="reference", causal_block_size=block))
        return nnx.jit(nnx.value_and_grad(lambda m: jnp.sum(jnp.tanh(m(*args)))))(model)

    def dots(block):  # the blocked model really runs more, smaller attention matmuls
        model = cls(cfg_cls(**base), rngs=nnx.Rngs(0),
                    execution=ExecutionConfig(attention_impl="reference", causal_block_size=block))
        graphdef, state = nnx.split(model)
        return str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(*args))(state)).count("dot_general")

    assert dots(2) == dots(None) + 2 * 3 * base["num_layers"]  # 4 blocks: 3 more QK and 3 more PV per layer
    ref_loss, ref_grads = loss_and_grads(None)
    loss, grads = loss_and_grads(2)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, ref_grads)


def test_causal_block_size_is_validated():
    with pytest.raises(ValueError, match="causal_block_size"):
        ExecutionConfig(causal_block_size=0)
    assert ExecutionConfig(causal_block_size=None).causal_block_size is None


# x narrower, dy narrower, equal; dy much narrower: (dy^T x)^T
@pytest.mark.parametrize("d_in,d_out", [(4, 12), (12, 4), (6, 6), (12, 1)])
@pytest.mark.parametrize("jit", [True, False])
def test_dense_equals_nnx_linear_values_and_gradients(d_in, d_out, jit):
    """Dense: nnx.Linear's parameters and values; on CPU float32 its custom kernel gradient
    (x^T dy, or (dy^T x)^T when dy is much narrower: `matmul_tn`) equals autodiff's."""
    dense = Dense(d_in, d_out, xla_cpu_grads=True, rngs=nnx.Rngs(0))  # the custom path under test
    linear = nnx.Linear(d_in, d_out, rngs=nnx.Rngs(0))
    for a, b in zip(jax.tree.leaves(nnx.state(dense)), jax.tree.leaves(nnx.state(linear))):
        np.testing.assert_array_equal(a, b)
    x = jax.random.normal(jax.random.key(1), (2, 5, d_in))
    w = jnp.cos(jnp.arange(2 * 5 * d_out, dtype=jnp.float32)).reshape(2, 5, d_out)

    def value_and_grads(model):
        f = nnx.value_and_grad(lambda m, x: jnp.sum(w * m(x)), argnums=(0, 1))
        return (nnx.jit(f) if jit else f)(model, x)

    (y_dense, g_dense), (y_linear, g_linear) = value_and_grads(dense), value_and_grads(linear)
    np.testing.assert_allclose(y_dense, y_linear, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_dense), jax.tree.leaves(g_linear)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_dense_kernel_gradient_numerically_and_in_the_fast_form():
    """Against central differences; and no dot in the compiled gradient contracts the token
    axis as the rows of its left operand (the form XLA:CPU runs slowly): x^T is made by the CPU
    kernel (`cpu_kernels.transpose`), or without it by an identity dot."""
    import re

    from jax.test_util import check_grads

    from txjax.ops import cpu_kernels

    x, kernel, bias = (jax.random.normal(jax.random.key(i), s) for i, s in
                       enumerate([(3, 4, 5), (5, 7), (7,)]))
    check_grads(xla_cpu.dense, (x, kernel, bias), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)
    for k in (kernel, kernel.T):  # 5 -> 7 and 7 -> 5
        xk = jax.random.normal(jax.random.key(3), (3, 4, k.shape[0]))
        grad = jax.jit(jax.grad(lambda x, k: jnp.sum(xla_cpu.dense(x, k) ** 2), (0, 1)))
        hlo = grad.lower(xk, k).compile().as_text()
        lhs_contracting = re.findall(r" dot\(.*lhs_contracting_dims=\{(\d+)\}", hlo)
        kernel = cpu_kernels.available()
        assert hlo.count('custom_call_target="txjax_transpose"') == kernel
        # forward, input and weight gradients, + `transposed`'s identity dot without the kernel
        assert len(lhs_contracting) == (3 if kernel else 4) and set(lhs_contracting) == {"1"}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(37, 5), (6, 40), (3, 4, 6), (9, xla_cpu.EYE_TRANSPOSE_MAX + 1)])
@pytest.mark.parametrize("jit", [True, False])
def test_transposed_is_the_exact_transpose(dtype, shape, jit):
    """`transposed` (an identity dot for 2-D float32 operands up to EYE_TRANSPOSE_MAX wide, a
    copy otherwise) returns x's last two axes swapped, bit for bit, for finite x of any sign and
    magnitude (normal numbers: the dot flushes subnormals to zero, as XLA:CPU's arithmetic does)."""
    magnitudes = jnp.logspace(-30, 30, shape[-1]).reshape((1,) * (len(shape) - 1) + (-1,))
    x = (jax.random.normal(jax.random.key(0), shape) * magnitudes).astype(dtype)
    got = (jax.jit(xla_cpu.transposed) if jit else xla_cpu.transposed)(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(jnp.swapaxes(x, -1, -2), np.float32))


@pytest.mark.parametrize("k,m,n,transposes", [(10, 3, 5, "a"), (10, 12, 4, "a"), (10, 12, 1, "b"), (40, 12, 2, "b")])
@pytest.mark.parametrize("jit", [True, False])
def test_matmul_tn_is_a_transpose_b_whichever_operand_it_transposes(k, m, n, transposes, jit):
    """matmul_tn(a [k, m], b [k, n]) = a^T b, exactly as the plain dot sums it, in both forms: a^T
    as the left operand (m <= n, or transposing a costs less than b and the [n, m] result together,
    at SWAPPED_RESULT_COST per result element), or (b^T a)^T. With the kernels built, the operand
    they transpose is the one the rule picks."""
    from txjax.ops import cpu_kernels

    assert (k * m <= k * n + xla_cpu.SWAPPED_RESULT_COST * m * n or m <= n) == (transposes == "a")
    a, b = (jax.random.normal(jax.random.key(i), s) for i, s in enumerate([(k, m), (k, n)]))
    got = (jax.jit(xla_cpu.matmul_tn) if jit else xla_cpu.matmul_tn)(a, b)
    np.testing.assert_allclose(got, jnp.einsum("km,kn->mn", a, b, precision="highest"), rtol=1e-6, atol=1e-6)
    if cpu_kernels.available():
        call = next(line for line in jax.jit(xla_cpu.matmul_tn).lower(a, b).compile().as_text().splitlines()
                    if 'custom_call_target="txjax_transpose"' in line)
        assert f"f32[{k},{m if transposes == 'a' else n}]" in call.split("custom-call")[1]


@pytest.mark.parametrize("form", ["nn", "nt"])
def test_matmuls_with_a_compute_dtype_give_unrounded_float32_gradients(form):
    """matmul_nn / matmul_nt(a, b, float32, dtype=bfloat16) on float32 a and b: the dots see a, b
    and the cotangent rounded to bfloat16, and the gradients are those dots' float32 sums, not
    rounded to bfloat16 again (that rounding alone would be off by ~2^-9); bfloat16 operands with a
    compute dtype are refused."""
    a = jax.random.normal(jax.random.key(0), (3, 5, 4))
    b = jax.random.normal(jax.random.key(1), (3, 4, 6) if form == "nn" else (3, 6, 4))
    w = jax.random.normal(jax.random.key(2), (3, 5, 6))
    matmul, spec = {"nn": (xla_cpu.matmul_nn, "bmk,bkn->bmn"), "nt": (xla_cpu.matmul_nt, "bmk,bnk->bmn")}[form]
    r = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)  # noqa: E731

    def loss(f, a, b):
        return jnp.sum(r(w) * f(a, b))

    grads = jax.grad(lambda a, b: loss(lambda a, b: matmul(a, b, jnp.float32, jnp.bfloat16), a, b), (0, 1))(a, b)
    # the same gradients from the bfloat16 numbers, in float32 (autodiff through r would round them)
    exact = jax.grad(lambda a, b: loss(lambda a, b: jnp.einsum(spec, a, b, precision="highest"), a, b),
                     (0, 1))(r(a), r(b))
    # atol 1e-5: float32 sums of a few products up to ~10 in another order (another CPU's kernel)
    # differ by a few ulps of those partial sums; the bfloat16 rounding tested against is >= 1e-2
    np.testing.assert_allclose(matmul(a, b, jnp.float32, jnp.bfloat16), jnp.einsum(spec, r(a), r(b)),
                               rtol=1e-6, atol=1e-5)
    for g, e in zip(grads, exact):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32 operands"):
        matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), jnp.float32, jnp.bfloat16)


def test_dense_in_bfloat16_accumulates_in_float32_with_bfloat16_dots():
    """bfloat16 takes the fast path too: bfloat16 operands, float32 accumulation and bias, one
    rounding at the end; its gradients are the float32 ones of the same bfloat16 numbers (to
    bfloat16's precision); and every dot of forward and backward is bfloat16 x bfloat16 ->
    float32, the form XLA:CPU runs with its bfloat16 kernels (not converted to float32 first)."""
    from tests.hlo_dots import dots

    dense = Dense(16, 24, dtype=jnp.bfloat16, xla_cpu_grads=True, rngs=nnx.Rngs(0))
    dense.bias[...] = jnp.linspace(-1.0, 1.0, 24)
    x = jax.random.normal(jax.random.key(1), (2, 8, 16)).astype(jnp.bfloat16)
    w = jnp.cos(jnp.arange(2 * 8 * 24, dtype=jnp.float32)).reshape(2, 8, 24)
    kernel, bias = dense.kernel[...].astype(jnp.bfloat16).astype(jnp.float32), dense.bias[...]

    y = dense(x)
    assert y.dtype == jnp.bfloat16
    expected = x.astype(jnp.float32) @ kernel + bias[None, None]
    np.testing.assert_allclose(y.astype(jnp.float32), expected, rtol=2**-8, atol=2**-8)

    def loss(m, x):
        return jnp.sum(w * m(x).astype(jnp.float32))

    grad_kernel, grad_x = nnx.grad(loss, argnums=(0, 1))(dense, x)
    exact_kernel, exact_x = jax.grad(lambda k, x: jnp.sum(w * (x @ k)), (0, 1))(kernel, x.astype(jnp.float32))
    np.testing.assert_allclose(grad_kernel.kernel[...], exact_kernel, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(grad_x.astype(jnp.float32), exact_x, rtol=2e-2, atol=2e-2)
    # the output's cotangent is w rounded to bfloat16; the bias gradient sums it in float32
    np.testing.assert_allclose(grad_kernel.bias[...], jnp.sum(w.astype(jnp.bfloat16).astype(jnp.float32), axis=(0, 1)),
                               rtol=1e-6)

    k16 = kernel.astype(jnp.bfloat16)
    step = jax.jit(jax.value_and_grad(lambda x, k: jnp.sum(xla_cpu.dense(x, k, bias).astype(jnp.float32) ** 2), (0, 1)))
    found = dots(step.lower(x, k16).compile().as_text())
    assert len(found) == 3 and all(d[:3] == ("f32", "bf16", "bf16") for d in found), found


def test_execution_config_picks_the_gradient_forms_visibly():
    """"auto" takes ops.xla_cpu's forms on the CPU backend only; the choice is an attribute."""
    assert ExecutionConfig().xla_cpu_grads("cpu") and not ExecutionConfig().xla_cpu_grads("gpu")
    assert ExecutionConfig(grad_forms="xla_cpu").xla_cpu_grads("tpu")
    assert not ExecutionConfig(grad_forms="autodiff").xla_cpu_grads("cpu")
    with pytest.raises(ValueError, match="grad_forms"):
        ExecutionConfig(grad_forms="fast")
    from txjax import GPT

    config = GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    for forms, expected in (("xla_cpu", True), ("autodiff", False)):
        model = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(grad_forms=forms))
        block = model.decoder.blocks[0]
        assert block.self_attn.xla_cpu_grads is expected and block.ffn.wi.xla_cpu_grads is expected


def test_the_cpu_forms_train_as_autodiff_does_over_20_steps():
    """A GPT (pre-norm, biases, tied head) trained 20 AdamW steps with clipping under the CPU's
    forms (grad_forms "xla_cpu", attention "auto": the fused kernel where it builds) and the
    plain formulas ("autodiff", "reference"): float32 losses agree to 1e-5 at every step (only the
    order of float sums may differ). Parameters are not compared: Adam divides a near-zero
    gradient by its own scale, so their rounding moves such a parameter by up to the step size."""
    from txjax import GPT
    from txjax.bench import make_batch
    from txjax.train.config import TrainConfig
    from txjax.train.steps import LOSSES, Stepper

    config = GPTConfig(vocab_size=17, max_len=24, d_model=32, num_heads=2, num_layers=2, d_ff=64)
    batch, key = make_batch(config, 4, 24), jax.random.key(0)

    def train(forms, attention):
        model = GPT(config, rngs=nnx.Rngs(0),
                    execution=ExecutionConfig(grad_forms=forms, attention_impl=attention, causal_block_size=8))
        train_config = TrainConfig(batch_size=4, steps=20, warmup_steps=2, learning_rate=1e-2, progress=False)
        stepper = Stepper(model, LOSSES["gpt"], train_config)
        state, losses = stepper.init_state(), []
        for _ in range(20):
            state, metrics = stepper.train_step(state, batch, key)
            losses.append(float(metrics["loss"]))
        return np.array(losses)

    fast, plain = train("xla_cpu", "auto"), train("autodiff", "reference")
    assert fast[-1] < fast[0] - 1.0, fast  # it learns the one batch
    np.testing.assert_allclose(fast, plain, rtol=1e-5)
