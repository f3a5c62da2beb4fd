"""Grouped-query / multi-query attention (num_kv_heads) and sliding-window attention (attention_window)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, cost, hf, ops
from txjax.config import ExecutionConfig
from txjax.ops import xla_cpu

jax.config.update("jax_numpy_rank_promotion", "raise")

TINY = dict(vocab_size=13, max_len=12, d_model=16, num_heads=4, num_layers=2, d_ff=32)
FAMILIES = {"gpt": (GPTConfig, GPT), "bert": (BertConfig, Bert), "t5": (T5Config, T5)}


def build(family, **changes):
    config_cls, model_cls = FAMILIES[family]
    return model_cls(config_cls(**{**TINY, **changes}), rngs=nnx.Rngs(0))


def tokens(seed, shape, low=1):
    return jnp.asarray(np.random.default_rng(seed).integers(low, TINY["vocab_size"], size=shape), jnp.int32)


def run(model, seed=0, t=7):
    """The family's logits on fixed random tokens (T5: encoder t tokens, decoder t - 1)."""
    if isinstance(model, T5):
        return model(tokens(seed, (2, t)), tokens(seed + 1, (2, t - 1), low=0))
    return model(tokens(seed, (2, t)))


# ---------------------------------------------------------------- config and bad input


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_num_kv_heads_and_window_are_clear_errors(family):
    config_cls = FAMILIES[family][0]
    for bad in (3, 0, 8, 2.0):
        with pytest.raises(ValueError, match="num_kv_heads.*dividing num_heads=4"):
            config_cls(**TINY, num_kv_heads=bad)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="attention_window must be a positive int"):
            config_cls(**TINY, attention_window=bad)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ops.attention_mask(jnp.arange(3), jnp.arange(3), causal=True, window=0)


def test_attention_rejects_kv_heads_that_do_not_divide():
    q = jnp.zeros((1, 3, 4, 2))
    k = jnp.zeros((1, 3, 3, 2))
    with pytest.raises(ValueError, match="do not divide"):
        ops.dot_product_attention(q, k, k)


@pytest.mark.parametrize("changes", [dict(num_kv_heads=2), dict(attention_window=3)])
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_export_refuses_gqa_and_windows(family, changes):
    config = FAMILIES[family][0](**{**TINY, **changes})
    with pytest.raises(hf.UnsupportedConfigError, match="num_kv_heads|attention_window"):
        hf.config_to_hf(config)


# ---------------------------------------------------------------- grouped-query attention


@pytest.mark.parametrize("family", FAMILIES)
def test_num_kv_heads_equal_num_heads_is_multi_head_attention(family):
    """Same parameters (same draws, same shapes) and exactly the same logits."""
    plain, explicit = build(family), build(family, num_kv_heads=4)
    jax.tree.map(np.testing.assert_array_equal, nnx.state(plain, nnx.Param), nnx.state(explicit, nnx.Param))
    np.testing.assert_array_equal(run(plain), run(explicit))


def repeated_kv_state(gqa_model, mha_model, groups):
    """The GQA model's parameters with every k/v projection's K heads repeated to N, as the MHA tree."""
    flat = dict(nnx.to_flat_state(nnx.state(gqa_model, nnx.Param)))
    head = gqa_model.config.head_size
    for path, leaf in flat.items():
        if len(path) >= 2 and path[-2] in ("k", "v") and any(p in ("self_attn", "cross_attn") for p in path):
            w = leaf.get_value()
            heads_KH = w.reshape(*w.shape[:-1], -1, head)
            flat[path] = leaf.replace(jnp.repeat(heads_KH, groups, axis=-2).reshape(*w.shape[:-1], -1))
    state = nnx.state(mha_model, nnx.Param)
    for path, leaf in nnx.to_flat_state(state):
        assert flat[path].get_value().shape == leaf.get_value().shape, path
    return nnx.from_flat_state(flat)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_gqa_equals_mha_with_repeated_kv_heads(family, kv_heads):
    """K = 2 (GQA) and K = 1 (MQA) in every family, T5's cross-attention included: the logits of
    multi-head attention whose k/v weights are the grouped ones, each head repeated N / K times."""
    position = dict(position="rope") if family == "gpt" else {}
    gqa, mha = build(family, num_kv_heads=kv_heads, **position), build(family, **position)
    nnx.update(mha, repeated_kv_state(gqa, mha, 4 // kv_heads))
    block = (gqa.decoder if family != "bert" else gqa.encoder).blocks[0].self_attn
    assert block.k.kernel.get_value().shape == (16, kv_heads * 4)
    np.testing.assert_allclose(run(gqa), run(mha), atol=1e-5, rtol=0)


ATTENTIONS = {
    "reference": ops.dot_product_attention,
    "xla": lambda *a, **kw: ops.dot_product_attention(*a, implementation="xla", **kw),
    "xla_cpu": xla_cpu.dot_product_attention,
}


@pytest.mark.parametrize("impl", ATTENTIONS)
@pytest.mark.parametrize("bias_kind", ["none", "window", "relative", "relative_row"])
def test_grouped_attention_equals_repeated_heads(impl, bias_kind):
    """Each implementation, with a mask, a per-head bias, or one broadcast over queries; and the
    causal query blocks over a windowed mask; values and gradients."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 6, 4, 3), (2, 6, 2, 3), (2, 6, 2, 3)))
    window = ops.mask_to_bias(ops.attention_mask(jnp.arange(6), jnp.arange(6), causal=True, window=2))
    relative = jnp.asarray(rng.normal(size=(1, 4, 6, 6)), jnp.float32)
    bias = {"none": None, "window": window, "relative": window + relative,
            "relative_row": relative[:, :, :1]}[bias_kind]
    blocks = 2 if bias_kind in ("window", "relative") else None
    attend = ATTENTIONS[impl]

    def loss(q, k, v, repeat):
        k, v = (jnp.repeat(x, 2, axis=2) for x in (k, v)) if repeat else (k, v)
        out = attend(q, k, v, bias, causal_block_size=blocks)
        return jnp.sum(out * jnp.cos(out)), out

    # jitted: eagerly, the causal blocks' many tiny ops took 9-14 s a case
    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
    (_, grouped), grads = value_and_grad(q, k, v, False)
    (_, repeated), grads_ref = value_and_grad(q, k, v, True)
    np.testing.assert_allclose(grouped, repeated, atol=1e-6)
    for g, r in zip(grads, grads_ref):
        np.testing.assert_allclose(g, r, atol=1e-5)
    weights = ops.attention_weights(q, k, bias)
    np.testing.assert_allclose(weights, ops.attention_weights(q, jnp.repeat(k, 2, axis=2), bias), atol=1e-6)


# ---------------------------------------------------------------- sliding window


def test_window_mask_against_hand_written_masks():
    causal_w2 = [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [0, 1, 1, 0, 0],
                 [0, 0, 1, 1, 0],
                 [0, 0, 0, 1, 1]]
    both_w1 = [[1, 1, 0, 0, 0],
               [1, 1, 1, 0, 0],
               [0, 1, 1, 1, 0],
               [0, 0, 1, 1, 1],
               [0, 0, 0, 1, 1]]
    p = jnp.arange(5)
    np.testing.assert_array_equal(ops.attention_mask(p, p, causal=True, window=2)[0, 0], causal_w2)
    np.testing.assert_array_equal(ops.attention_mask(p, p, causal=False, window=1)[0, 0], both_w1)
    # Two new tokens at positions 3, 4 over a cache of 6 slots whose slot 5 is not written yet.
    valid = jnp.array([[True] * 5 + [False]])
    over_cache = ops.attention_mask(jnp.array([3, 4]), jnp.arange(6), causal=True, window=3, k_valid_BS=valid)
    np.testing.assert_array_equal(over_cache[0, 0], [[0, 1, 1, 1, 0, 0],
                                                     [0, 0, 1, 1, 1, 0]])
    # Per-row positions [B, T]: row 1 is shifted by 2, its mask is row 0's.
    rows = jnp.stack([p, p + 2])
    per_row = ops.attention_mask(rows, rows, causal=True, window=2)
    assert per_row.shape == (2, 1, 5, 5)
    np.testing.assert_array_equal(per_row[:, 0], [causal_w2, causal_w2])


@pytest.mark.parametrize("family", FAMILIES)
def test_window_at_least_the_length_is_full_attention(family):
    full = run(build(family))
    for w in (7, 50):
        np.testing.assert_array_equal(run(build(family, attention_window=w)), full)


def test_gpt_window_changes_only_positions_beyond_it():
    """Queries before W see every key anyway; later ones lose the oldest keys."""
    full, windowed = run(build("gpt", position="rope")), run(build("gpt", position="rope", attention_window=3))
    np.testing.assert_allclose(windowed[:, :3], full[:, :3], atol=1e-6)
    assert np.abs(windowed[:, 3:] - full[:, 3:]).min() > 0


def test_causal_query_blocks_stay_exact_with_a_window():
    config = GPTConfig(**TINY, attention_window=3, num_kv_heads=2)
    one = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(causal_block_size=None))
    blocked = GPT(config, rngs=nnx.Rngs(0), execution=ExecutionConfig(causal_block_size=2))
    np.testing.assert_allclose(run(blocked, t=9), run(one, t=9), atol=1e-6)


# ---------------------------------------------------------------- cost model


@pytest.mark.parametrize("dtype,size", [(jnp.float32, 4), (jnp.bfloat16, 2)])
@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_kv_cache_bytes_equal_a_real_cache(family, dtype, size):
    model = build(family, num_kv_heads=1)
    cache = model.init_cache(3, 10, dtype) if family == "gpt" else model.init_cache(tokens(0, (3, 5)), 10, dtype)
    real = sum(x.nbytes for x in cache.k + cache.v)
    assert cost.config_kv_cache_bytes(model.config, 3, 10, size) == real
    assert cost.config_kv_cache_bytes(model.config.replace(num_kv_heads=None), 3, 10, size) == 4 * real


def test_gpt2_small_cache_saved_by_gqa():
    """The notes' L·B·2·D·T·s becomes L·B·2·(D·K/N)·T·s: K = 4 of N = 12 heads keep a third."""
    mha, gqa = GPTConfig.gpt2_small(), GPTConfig.gpt2_small(num_kv_heads=4)
    for s in (4, 2):
        assert cost.config_kv_cache_bytes(mha, 1, 1024, s) == 12 * 1 * 2 * 768 * 1024 * s
        assert cost.config_kv_cache_bytes(gqa, 1, 1024, s) == 12 * 1 * 2 * (768 * 4 // 12) * 1024 * s
    assert cost.param_count(mha) - cost.param_count(gqa) == 12 * 2 * (768 * 768 - 768 * 256 + 768 - 256)


def test_forward_flops_count_grouped_projections_and_windowed_scores():
    n, d, layers, b, w = 20, 16, 2, 3, 5
    config = GPTConfig(**{**TINY, "max_len": n}, num_kv_heads=1)
    fwd = cost.forward_flops(config, b, n)
    assert fwd["attention_projections"] == b * layers * (4 * n * d * d + 4 * n * d * 4)
    assert fwd["attention_scores"] == b * layers * 4 * n * n * d
    assert cost.forward_flops(config.replace(attention_window=w), b, n)["attention_scores"] == (
        b * layers * 4 * n * w * d)
    assert cost.forward_flops(config.replace(attention_window=n + 3), b, n) == fwd
    bert = BertConfig(**{**TINY, "max_len": n}, attention_window=w)
    assert cost.forward_flops(bert, b, n)["attention_scores"] == b * layers * 4 * n * (2 * w + 1) * d
    t5 = T5Config(**{**TINY, "max_len": n}, attention_window=w)
    t5_fwd, t5_full = cost.forward_flops(t5, b, n, 8), cost.forward_flops(t5.replace(attention_window=None), b, n, 8)
    assert t5_fwd["attention_scores"] == b * layers * 4 * d * (n * (2 * w + 1) + 8 * w)
    assert t5_fwd["cross_attention"] == t5_full["cross_attention"]  # the window is self-attention's
