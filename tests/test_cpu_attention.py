"""The fused CPU attention kernel (txjax.ops.cpu_attention) against the reference formula:
values and every gradient, for masks, relative biases, grouped queries, caches, odd head
widths; and the models with attention_impl="cpu_fused" against "reference"."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, ops
from txjax.config import ExecutionConfig
from txjax.ops import cpu_attention, cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler to build the kernel")


def _inputs(b, t, s, n, k, h, seed=0):
    kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(kq, (b, t, n, h)), jax.random.normal(kk, (b, s, k, h)),
            jax.random.normal(kv, (b, s, k, h)), jax.random.normal(kd, (b, t, n, h)))


def _value_and_grads(fn, q, k, v, bias, d_out):
    """out and d(sum(out * d_out)) for q, k, v and (if given) the bias."""
    args = (q, k, v) if bias is None else (q, k, v, bias)
    out, vjp = jax.vjp(lambda *a: fn(*a) if bias is not None else fn(*a, None), *args)
    return out, vjp(d_out)


def _bias(kind, b, t, s, n, seed=1):
    """None, a causal mask (queries the last t of s keys), padding with one fully hidden row,
    or a causal mask plus a learned-looking [1, N, T, S] relative bias."""
    causal = ops.mask_to_bias(ops.causal_mask(t, s))
    if kind == "none":
        return None
    if kind == "causal":
        return causal
    if kind == "padding":
        valid_BS = jnp.arange(s)[None, :] < jnp.array([s, s // 2, 0] * b)[:b, None]
        return ops.mask_to_bias(valid_BS[:, None, None, :])
    return causal + jax.random.normal(jax.random.key(seed), (1, n, t, s))


def _check(b, t, s, n, k, h, kind, jit, causal_flag, atol=2e-5):
    q, kk, v, d_out = _inputs(b, t, s, n, k, h)
    bias = _bias(kind, b, t, s, n)
    ref = lambda q, k, v, bias: ops.dot_product_attention(q, k, v, bias)
    fused = lambda q, k, v, bias: cpu_attention.attention(q, k, v, bias, causal=causal_flag)
    jitted = jax.jit(_value_and_grads, static_argnums=0)
    run = jitted if jit else _value_and_grads
    out_ref, g_ref = jitted(ref, q, kk, v, bias, d_out)  # the plain formula; eager it took ~1.3 s a case
    out, g = run(fused, q, kk, v, bias, d_out)
    np.testing.assert_allclose(out, out_ref, atol=atol, rtol=1e-5)
    for name, a, e in zip("qkvb", g, g_ref):
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, e, atol=atol, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("b,t,n,h", [(2, 197, 4, 32), (3, 9, 2, 8), (2, 40, 3, 80), (1, 17, 1, 100), (1, 128, 2, 64)])
def test_matches_reference_causal(b, t, n, h, jit):
    """The bench config's attention (T 197, H 32), head widths that are not a multiple of 16, and
    T 128, whose score rows (512 bytes) the kernel lays out 576 bytes apart."""
    _check(b, t, t, n, n, h, "causal", jit=jit, causal_flag=True)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 40), extra=st.integers(0, 20), n=st.sampled_from([1, 2, 4, 6]),
       groups=st.sampled_from([1, 2]), h=st.sampled_from([4, 8, 16, 24, 32, 48, 64, 72]),
       kind=st.sampled_from(["none", "causal", "padding", "relative"]), jit=st.booleans())
def test_matches_reference_property(b, t, extra, n, groups, h, kind, jit):
    """Any shape: S >= T keys (a cache's T new queries are the last T), K = N / groups key heads,
    every bias kind; the causal skip only where S == T and the bias is causal, as a model uses it."""
    k = n // groups if n % groups == 0 else n
    s = t + extra
    _check(b, t, s, n, k, h, kind, jit=jit, causal_flag=kind in ("causal", "relative") and s == t)


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    q, k, v, d_out = _inputs(2, 5, 5, 2, 2, 8)
    bias = jnp.full((2, 1, 5, 5), -jnp.inf).at[0].set(0.0)  # row 1: every key hidden
    out, (dq, dk, dv) = _value_and_grads(lambda q, k, v, _: cpu_attention.attention(q, k, v, bias),
                                         q, k, v, None, d_out)
    assert np.all(np.asarray(out[1]) == 0.0)
    for g in (dq, dk, dv):
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g[1]) == 0.0)


def test_a_mask_gets_no_gradient_work_and_a_learned_bias_gets_its_sum():
    """A bias that is not differentiated (a mask) returns no cotangent; a [1, N, T, S] one gets
    the score gradient summed over the batch, as autodiff of the formula gives."""
    q, k, v, d_out = _inputs(3, 6, 6, 2, 2, 8)
    rel = jax.random.normal(jax.random.key(3), (1, 2, 6, 1))  # broadcast over keys too
    f = lambda rel, impl: jnp.sum(ops.dot_product_attention(q, k, v, rel, implementation=impl) * d_out)
    np.testing.assert_allclose(jax.grad(f)(rel, "cpu_fused"), jax.grad(f)(rel, "reference"), atol=1e-5)
    hlo = jax.jit(jax.grad(lambda q: jnp.sum(cpu_attention.attention(q, k, v, ops.mask_to_bias(
        ops.causal_mask(6)), causal=True)))).lower(q).as_text()
    assert "bias_grad = 0 : i32" in hlo and "bias_grad = 1" not in hlo


def _bf16(x):
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def _flash_bf16(q, k, v, bias, scale):
    """Attention as the kernel's bfloat16 products compute it, from the formula in float32: q k^T and
    dO v^T of the bfloat16 inputs, the softmax and dS = P (dP - rowsum(dO O)) in float32, and P
    and dS rounded to bfloat16 before the products P v, dS k, dS^T q and P^T dO (FlashAttention's
    recipe). Returns out and a function of d_out giving dq, dk, dv."""
    s = jnp.einsum("btnh,bsnh->bnts", q, k) * scale + (0.0 if bias is None else bias)
    p = jax.nn.softmax(s, axis=-1)
    out = _bf16(jnp.einsum("bnts,bsnh->btnh", _bf16(p), v))

    def grads(d_out):
        dp = jnp.einsum("btnh,bsnh->bnts", d_out, v)
        ds = _bf16(p * (dp - jnp.einsum("btnh,btnh->bnt", d_out, out)[..., None]))
        return (jnp.einsum("bnts,bsnh->btnh", ds, k) * scale, jnp.einsum("bnts,btnh->bsnh", ds, q) * scale,
                jnp.einsum("bnts,btnh->bsnh", _bf16(p), d_out))

    return out, grads


@pytest.mark.parametrize("h", [16, 32])
def test_bfloat16_inputs_return_bfloat16(h):
    """Without bfloat16 products (and for heads narrower than they take) the kernel computes in
    float32 and rounds once; with them, P is rounded before P v."""
    q, k, v, _ = _inputs(2, 9, 9, 2, 2, h)
    out = cpu_attention.attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
    q, k, v = (_bf16(x) for x in (q, k, v))
    dot16 = cpu_attention.bf16_heads(h)
    ref = _flash_bf16(q, k, v, None, h**-0.5)[0] if dot16 else ops.dot_product_attention(q, k, v)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(out.astype(jnp.float32), ref, rtol=2**-8, atol=1e-6)  # one bfloat16 rounding


@pytest.mark.skipif(not cpu_attention.bf16_heads(32),
                    reason="no AMX or AVX512-BF16 here: bfloat16 heads compute in float32")
@pytest.mark.parametrize("b,t,s,n,h,kind,causal", [
    (2, 40, 40, 3, 80, "causal", True), (1, 200, 200, 2, 64, "causal", True), (2, 13, 20, 2, 32, "none", False),
    (3, 6, 6, 2, 48, "padding", False), (2, 33, 33, 4, 32, "relative", True)])
def test_bfloat16_products_are_flash_attention_in_bfloat16(b, t, s, n, h, kind, causal):
    """The heads with bfloat16 products (AMX or AVX512-BF16) against `_flash_bf16` (the same
    roundings, other orders of float32 sums): one bfloat16 step at the largest magnitude for the
    output and every gradient; causal blocks skipped, head widths padded to 32, keys not a multiple
    of 32, a row with no visible key, a bias."""
    q, k, v, d_out = (_bf16(x) for x in _inputs(b, t, s, n, n, h))
    bias = _bias(kind, b, t, s, n)
    scale = 1 / np.sqrt(h)
    out, vjp = jax.vjp(lambda q, k, v: cpu_attention.attention(q, k, v, bias, causal=causal),
                       *(x.astype(jnp.bfloat16) for x in (q, k, v)))
    got = [out, *vjp(d_out.astype(jnp.bfloat16))]
    want_out, grads = _flash_bf16(q, k, v, bias, scale)
    for g, e in zip(got, [want_out, *grads(d_out)]):
        assert g.dtype == jnp.bfloat16
        e = np.nan_to_num(np.asarray(e))
        np.testing.assert_allclose(np.asarray(g, np.float32), e, rtol=0, atol=2**-7 * np.abs(e).max())


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_bfloat16_is_read_and_written_by_the_kernel_with_one_rounding(kv_heads):
    """bfloat16 q, k, v go into the kernel as they are (K = N) and out comes bfloat16, rounded
    to nearest even as XLA's convert rounds the float32 path's output: the same bits (with bfloat16
    products, within a rounding: its P is rounded before P v, and its dS before dS k and dS^T q). Their
    gradients come out of the kernel in bfloat16 too; the backward's rowsum(dO * O) reads the
    rounded O (FlashAttention's choice), so they are held to the float32 gradient of the same
    bfloat16 numbers within a bfloat16 step at the largest magnitude, as the float32 path's are.
    Grouped queries (K < N) take the float32 path, their dk and dv summed over the group before
    the one rounding."""
    q, k, v, _ = _inputs(2, 11, 11, 4, kv_heads, 24)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    bias = ops.mask_to_bias(ops.causal_mask(11))
    w = jnp.cos(jnp.arange(2 * 11 * 4 * 24, dtype=jnp.float32)).reshape(2, 11, 4, 24)

    def kernel(q, k, v):
        return cpu_attention.attention(q, k, v, bias, causal=True)

    def float32_path(q, k, v):
        return cpu_attention.attention(*(x.astype(jnp.float32) for x in (q, k, v)), bias, causal=True).astype(q.dtype)

    def exact(q, k, v):
        return ops.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), bias)

    call = next(line for line in jax.jit(kernel).lower(q, k, v).as_text().splitlines() if "txjax_attention_forward" in line)
    assert ("bf16" in call) == (kv_heads == 4)
    dot16 = kv_heads == 4 and cpu_attention.bf16_heads(24)  # then P is rounded to bfloat16 before P v
    got, f32 = (np.asarray(jax.jit(f)(q, k, v), np.float32) for f in (kernel, float32_path))
    np.testing.assert_allclose(got, f32, rtol=0, atol=2**-7 * np.abs(f32).max() if dot16 else 0)
    got, f32, want = ([np.asarray(g, np.float32) for g in jax.jit(jax.grad(
        lambda q, k, v: jnp.sum(w * f(q, k, v).astype(jnp.float32)), (0, 1, 2)))(q, k, v)]
        for f in (kernel, float32_path, exact))
    for g, f, e in zip(got, f32, want):
        step = 2**-7 * np.abs(e).max()  # one bfloat16 step at the largest gradient (measured errors: 2^-8 to 2^-7)
        np.testing.assert_allclose(g, e, rtol=0, atol=2 * step if dot16 else step)  # P and dS rounded too
        np.testing.assert_allclose(f, e, rtol=0, atol=step)


def test_vmap_runs_each_element():
    q, k, v, _ = _inputs(2, 7, 7, 2, 2, 8)
    batched = jax.vmap(lambda q, k, v: cpu_attention.attention(q, k, v))(q[:, None], k[:, None], v[:, None])
    np.testing.assert_allclose(batched[:, 0], ops.dot_product_attention(q, k, v), atol=1e-6)


def test_causal_blocks_promise_is_checked_as_for_the_reference():
    q, k, v, _ = _inputs(1, 4, 4, 1, 1, 8)
    with pytest.raises(ValueError, match="causal"):
        ops.dot_product_attention(q, k, v, None, implementation="cpu_fused", causal_block_size=2)
    with pytest.raises(ValueError, match="causal bias"):
        ops.dot_product_attention(q, k, v, jnp.zeros((1, 1, 4, 4)), implementation="cpu_fused", causal_block_size=2)


def assert_models_match(family: str, execution: ExecutionConfig, reference: ExecutionConfig, **fields) -> None:
    """A small model's logits and every parameter's gradient under `execution` against `reference`,
    padded tokens included (GPT: none)."""
    cls, cfg = {"gpt": (GPT, GPTConfig), "bert": (Bert, BertConfig), "t5": (T5, T5Config)}[family]
    config = cfg(vocab_size=13, max_len=12, d_model=32, num_heads=4, num_layers=2, d_ff=64,
                 pad_id=None if family == "gpt" else 0, **fields)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 11)), jnp.int32)
    if family != "gpt":
        tokens = tokens.at[1, 7:].set(0)
    args = (tokens, tokens) if family == "t5" else (tokens,)

    def loss_and_grads(execution):
        model = cls(config, rngs=nnx.Rngs(0), execution=execution)
        return nnx.jit(nnx.value_and_grad(lambda m: jnp.sum(jnp.tanh(m(*args)))))(model)

    loss, grads = loss_and_grads(execution)
    ref_loss, ref_grads = loss_and_grads(reference)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4), grads, ref_grads)


@pytest.mark.parametrize("family,position", [("gpt", "learned"), ("gpt", "kerple"), ("bert", "rope"),
                                             ("t5", "t5")])
def test_models_match_the_reference_implementation(family, position):
    assert_models_match(family, ExecutionConfig(attention_impl="cpu_fused"),
                        ExecutionConfig(attention_impl="reference"), position=position)


def test_auto_picks_the_kernel_on_the_cpu_only():
    assert ExecutionConfig().attention("cpu") == "cpu_fused"
    assert ExecutionConfig().attention("gpu") == "reference"
    assert ExecutionConfig(attention_impl="reference").attention("cpu") == "reference"


def test_without_a_compiler_auto_falls_back_with_a_warning(tmp_path):
    """A fresh process whose $CXX does not exist and whose cache is empty: auto is the reference,
    the warning says why, and the weight gradients' transposes are identity dots (exact)."""
    code = ("import warnings, jax, numpy as np\nfrom txjax.config import ExecutionConfig\n"
            "from txjax.ops import xla_cpu\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    print(ExecutionConfig().attention('cpu'), any('C++ compiler' in str(x.message) for x in w))\n"
            "x = np.random.default_rng(0).standard_normal((70, 9)).astype(np.float32)\n"
            "hlo = jax.jit(xla_cpu.transposed).lower(x).compile().as_text()\n"
            "print('custom-call' in hlo, (np.asarray(xla_cpu.transposed(x)) == x.T).all())\n")
    env = {"CXX": str(tmp_path / "no-such-compiler"), "XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["reference", "True", "False", "True"], done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="builds for the x86-64 baseline")
def test_the_kernels_built_for_the_x86_64_baseline_match_the_reference(tmp_path):
    """The kernels (attention, norms, activations, transpose) are GCC vector code, built with -march=native for
    the CPU they run on. Built instead for the x86-64 baseline (SSE2: 128-bit vectors and no FMA,
    so other roundings than this machine's), they still pass these checks: what a CPU without
    AVX-512 or AVX2 computes.
    A fresh process with an empty cache and a $CXX that swaps the -march flag."""
    log = tmp_path / "compiler_args"
    wrapper = tmp_path / "cxx"
    wrapper.write_text('#!/bin/sh\necho "$@" >> "%s"\nfor a in "$@"; do\n'
                       '  [ "$a" = -march=native ] && a=-march=x86-64\n  set -- "$@" "$a"\n  shift\ndone\n'
                       'echo "$@" >> "%s"\nexec %s "$@"\n' % (log, log, os.environ.get("CXX", "g++")))
    wrapper.chmod(0o755)
    code = ("import sys\nsys.path.insert(0, %r)\nimport test_cpu_attention as t, test_cpu_kernels as k\n"
            "assert t.cpu_kernels.available()\n"
            "for case in [(2, 40, 40, 3, 3, 80, 'causal', True, True), (1, 17, 17, 1, 1, 100, 'causal', False, True),\n"
            "             (3, 9, 12, 2, 1, 8, 'padding', True, False), (2, 13, 13, 4, 2, 16, 'relative', True, True)]:\n"
            "    t._check(*case)\n"
            "t.test_bfloat16_is_read_and_written_by_the_kernel_with_one_rounding(4)\n"
            "assert t.cpu_kernels.bf16_min_head() == 0\n"
            "k.test_transpose_of_large_arrays_split_over_threads((1000, 600), k.jnp.float32)\n"
            "k.test_transpose_of_large_arrays_split_over_threads((4099, 131), k.jnp.bfloat16)\n"
            "import test_cpu_norm as nm\n"
            "for case in [((3, 37), nm.jnp.float32, 'layer', True, True), ((2, 5, 80), nm.jnp.bfloat16, 'rms', False, False)]:\n"
            "    nm._check(*case)\n"
            "import test_cpu_activation as ac\n"
            "for kind in ac.KINDS:\n"
            "    ac._check((5, 37), ac.jnp.float32, kind, True)\n"
            "    ac._check((3, 40), ac.jnp.bfloat16, kind, False)\n"
            "    ac.test_float32_values_and_derivatives_are_the_formulas(kind)\n"
            "print('checked')\n") % str(Path(__file__).parent)
    env = {**os.environ, "CXX": str(wrapper), "XDG_CACHE_HOME": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.split()[-1:] == ["checked"], done.stderr[-3000:]
    asked, ran = log.read_text().splitlines()[-2:]  # the build went through the wrapper, which swapped the flag
    assert "-march=native" in asked.split() and "-march=x86-64" in ran.split() and "-march=native" not in ran
