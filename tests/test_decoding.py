"""Decoding: KV cache == full forward, generate (greedy, keys, EOS, T5), bad lengths; sampling is in test_sampling.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, decoding, generate
from txjax.config import positions_for
from txjax.ops import ROPE_SCALINGS

jax.config.update("jax_numpy_rank_promotion", "raise")

TINY = dict(vocab_size=13, max_len=12, d_model=16, num_heads=2, num_layers=2, d_ff=32)


def gpt(**changes):
    return GPT(GPTConfig(**{**TINY, **changes}), rngs=nnx.Rngs(0))


def t5(**changes):
    return T5(T5Config(**{**TINY, **changes}), rngs=nnx.Rngs(0))


def tokens(seed, shape, low=0, high=TINY["vocab_size"]):
    return jnp.asarray(np.random.default_rng(seed).integers(low, high, size=shape), jnp.int32)


def stepwise_logits(model, cache, seq_BT, chunks):
    """Eagerly feed seq_BT through decode_step in chunks of the given sizes; concatenated logits."""
    out, start = [], 0
    for size in chunks:
        logits_BTV, cache = model.decode_step(seq_BT[:, start:start + size], cache)
        out.append(logits_BTV)
        start += size
    assert int(cache.index) == start
    return jnp.concatenate(out, axis=1)


def jitted_cache_vs_full(model, run_full, init_cache, seq_BT, prefill, *args):
    """One compiled function: the full forward, and a prefill of `prefill` tokens followed
    by a lax.scan of one-token steps (so one step shape serves every position). `args`
    go to run_full and init_cache as traced arrays (closed-over ones would be constants)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def both(state, seq_BT, *args):
        m = nnx.merge(graphdef, state)
        logits_BTV, cache = m.decode_step(seq_BT[:, :prefill], init_cache(m, *args))

        def step(cache, token_B):
            step_logits_B1V, cache = m.decode_step(token_B[:, None], cache)
            return cache, step_logits_B1V[:, 0]

        cache, rest_TBV = jax.lax.scan(step, cache, seq_BT[:, prefill:].T)
        cached_BTV = jnp.concatenate([logits_BTV, jnp.transpose(rest_TBV, (1, 0, 2))], axis=1)
        return run_full(m, seq_BT, *args), cached_BTV, cache

    return both(state, seq_BT, *args)


# ---------------------------------------------------------------- cache == full forward


SCALED = [dict(rope_scaling=s, rope_scaling_factor=2.0, rope_original_max_len=6) for s in ROPE_SCALINGS]


@pytest.mark.parametrize("position,scaling", [(p, {}) for p in positions_for("gpt")] + [
    pytest.param(p, c, id=f"{p}-{c['rope_scaling']}") for p in ("rope", "xpos") for c in SCALED])
def test_gpt_cached_logits_equal_full_forward(position, scaling):
    """Prefill 3 tokens, then one per step: every step's logits equal the full forward's.

    pad_id is set and row 1 holds pads (row 0 none): padded keys are hidden from later
    queries in the cache exactly as in the full forward. Rotary keys (rope, scaled rope,
    xpos) are cached rotated at their own positions.
    """
    model = gpt(position=position, pad_id=0, **scaling)
    seq_BT = tokens(0, (2, 9), low=1).at[1, 0].set(0).at[1, 4].set(0)
    full, cached, cache = jitted_cache_vs_full(
        model, lambda m, s: m(s), lambda m: m.init_cache(2, 10), seq_BT, 3
    )
    np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0)
    assert int(cache.index) == 9
    np.testing.assert_array_equal(cache.valid_BS[:, :9], seq_BT != 0)
    assert not np.any(cache.valid_BS[:, 9:])


@pytest.mark.parametrize("position", positions_for("t5"))
def test_t5_cached_logits_equal_full_forward(position):
    """Decoder self-attention cache plus cross k/v from init_cache: logits equal T5(enc, dec),
    and the cached cross keys and values are the projections of the encoder output."""
    model = t5(position=position, num_layers=1, num_decoder_layers=2)
    enc_BS = tokens(3, (2, 7), low=1).at[1, 5:].set(0)  # row 1 has encoder padding
    dec_BT = tokens(4, (2, 6))

    def full(m, dec_BT, enc_BS):
        enc_BSD = m.encode(enc_BS)
        projections = [block.cross_attn.project_kv(enc_BSD) for block in m.decoder.blocks]
        return m.decode(dec_BT, enc_BSD, enc_BS), projections

    (full, projections), cached, cache = jitted_cache_vs_full(
        model, full, lambda m, enc_BS: m.init_cache(enc_BS, 8), dec_BT, 2, enc_BS
    )
    np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0)
    assert len(cache.cross_k) == model.config.decoder_layers
    for (k_ref, v_ref), k, v in zip(projections, cache.cross_k, cache.cross_v):
        np.testing.assert_allclose(k, k_ref, atol=1e-6)
        np.testing.assert_allclose(v, v_ref, atol=1e-6)
    chex.assert_shape(cache.k, [(2, 8, 2, 8)] * 2)
    np.testing.assert_array_equal(cache.cross_mask[:, 0, 0], enc_BS != 0)


GQA_WINDOW = [dict(num_kv_heads=1), dict(attention_window=3), dict(num_kv_heads=2, attention_window=2)]


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
@pytest.mark.parametrize("changes", GQA_WINDOW, ids=["mqa", "window", "gqa-window"])
def test_gpt_cache_with_gqa_and_window_equals_full_forward(changes, position):
    """Grouped kv heads in the cache, and a window (smaller than the 9 tokens) hiding the keys
    older than W while decoding past it: the logits of the full forward with the window mask."""
    model = gpt(num_heads=4, position=position, pad_id=0, **changes)
    seq_BT = tokens(0, (2, 9), low=1).at[1, 4].set(0)
    full, cached, cache = jitted_cache_vs_full(
        model, lambda m, s: m(s), lambda m: m.init_cache(2, 10), seq_BT, 3
    )
    np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0)
    chex.assert_shape(cache.k, [(2, 10, model.config.kv_heads, 4)] * 2)


@pytest.mark.parametrize("changes", GQA_WINDOW[::2], ids=["mqa", "gqa-window"])
def test_t5_cache_with_gqa_and_window_equals_full_forward(changes):
    """T5's decoder: self- and cross-attention caches of K heads; the window on self-attention."""
    model = t5(num_heads=4, num_layers=1, **changes)
    enc_BS = tokens(3, (2, 7), low=1).at[1, 5:].set(0)
    dec_BT = tokens(4, (2, 6))
    full, cached, cache = jitted_cache_vs_full(
        model, lambda m, dec_BT, enc_BS: m(enc_BS, dec_BT), lambda m, enc_BS: m.init_cache(enc_BS, 8),
        dec_BT, 2, enc_BS)
    np.testing.assert_allclose(cached, full, atol=1e-5, rtol=0)
    kv = model.config.kv_heads
    chex.assert_shape(cache.k + cache.cross_k, [(2, 8, kv, 4), (2, 7, kv, 4)])  # one decoder layer


def test_cache_eager():
    """Without jit too (eager dispatch is slow on 2 cores: one small case): one token into a
    cache longer than needed, then two at once at a non-zero index."""
    model = gpt(position="learned", num_layers=1)
    seq_BT = tokens(2, (1, 3))
    cached = stepwise_logits(model, model.init_cache(1, 5), seq_BT, [1, 2])
    np.testing.assert_allclose(cached, model(seq_BT), atol=1e-5, rtol=0)


def test_cache_overflow_and_encoder_stack_are_refused():
    model = gpt(num_layers=1)
    cache = model.init_cache(1, 4).replace(index=jnp.asarray(3, jnp.int32))
    with pytest.raises(ValueError, match="do not fit the cache"):
        model.decode_step(tokens(6, (1, 2)), cache)
    with pytest.raises(ValueError, match="do not fit the cache"):
        model.decode_step(tokens(6, (1, 5)), model.init_cache(1, 4))
    with pytest.raises(ValueError, match="init_cache"):
        t5().decode_step(tokens(6, (1, 1)), cache)


def test_one_compiled_step_serves_every_position():
    """The jitted single-token step is traced once, whatever the cache index."""
    model = gpt(position="t5")
    graphdef, state = nnx.split(model)
    traces = []

    @jax.jit
    def step(state, token_B1, cache):
        traces.append(1)
        return nnx.merge(graphdef, state).decode_step(token_B1, cache)

    cache = model.init_cache(2, 10)
    for i in range(10):
        _, cache = step(state, tokens(i, (2, 1)), cache)
    assert len(traces) == 1
    assert int(cache.index) == 10


def test_generate_traces_decode_step_once_per_compile(monkeypatch):
    """generate compiles one loop: decode_step is traced for the prefill and the loop body
    only, however many tokens are made, and a second call (new key, new prompt) reuses it."""
    calls = []
    original = GPT.decode_step

    def counting(self, tokens_BT, cache):
        calls.append(tokens_BT.shape)
        return original(self, tokens_BT, cache)

    monkeypatch.setattr(GPT, "decode_step", counting)
    model = gpt(vocab_size=19, position="sinusoidal")  # a config no other test compiles
    out = generate(model, tokens(7, (2, 3)), 9, jax.random.key(0))
    assert calls == [(2, 2), (2, 1)]  # prefill of T - 1 tokens, then the loop body
    generate(model, tokens(8, (2, 3)), 9, jax.random.key(1))
    assert len(calls) == 2
    chex.assert_shape(out, (2, 12))


# ---------------------------------------------------------------- greedy generation


def greedy_reference(model, prompt_BT, n, enc_BS=None):
    """Greedy decoding the obvious way: a Python loop of full forwards and argmax.

    The forward runs (jitted once) on a zero-padded buffer of the final length; the
    model is causal, so position i's logits do not see the padding after it.
    """
    b, t = prompt_BT.shape
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, seq_BL, enc_BS):
        m = nnx.merge(graphdef, state)
        return m(seq_BL) if enc_BS is None else m(enc_BS, seq_BL)

    seq = np.zeros((b, t + n), np.int32)
    seq[:, :t] = prompt_BT
    for i in range(t, t + n):
        seq[:, i] = np.argmax(forward(state, jnp.asarray(seq), enc_BS)[:, i - 1], -1)
    return seq


@pytest.fixture(scope="module")
def greedy_gpt():
    """A tiny GPT, three prompts and their greedy continuation the obvious way: 3 + 9 tokens
    fill the learned position table exactly."""
    model = gpt(position="learned")
    prompt_BT = tokens(9, (3, 3))
    return model, prompt_BT, greedy_reference(model, prompt_BT, 9)


def test_greedy_with_and_without_cache_match_reference(greedy_gpt):
    model, prompt_BT, reference = greedy_gpt
    cached = generate(model, prompt_BT, 9, jax.random.key(0), temperature=0.0)
    uncached = generate(model, prompt_BT, 9, jax.random.key(0), temperature=0.0, use_cache=False)
    chex.assert_shape(cached, (3, 12))
    assert cached.dtype == jnp.int32
    np.testing.assert_array_equal(cached, reference)
    np.testing.assert_array_equal(uncached, reference)


@pytest.mark.slow
def test_greedy_runs_past_max_len_without_a_learned_table():
    model = gpt(position="rope")
    prompt_BT = tokens(9, (2, 4))
    reference = greedy_reference(model, prompt_BT, 10)  # 4 + 10 > max_len = 12
    np.testing.assert_array_equal(generate(model, prompt_BT, 10, jax.random.key(0), temperature=0.0),
                                  reference)
    np.testing.assert_array_equal(
        generate(model, prompt_BT, 10, jax.random.key(0), temperature=0.0, use_cache=False), reference)


def test_top_k_one_is_greedy_at_any_temperature(greedy_gpt):
    model, prompt_BT, reference = greedy_gpt
    for seed in (1, 2):
        top1 = generate(model, prompt_BT, 9, jax.random.key(seed), temperature=3.0, top_k=1)
        np.testing.assert_array_equal(top1, reference)


def test_a_key_reproduces_its_sample_and_other_keys_differ(greedy_gpt):
    model, prompt_BT, _ = greedy_gpt
    a = generate(model, prompt_BT, 9, jax.random.key(5), temperature=1.0, top_p=0.9)
    b = generate(model, prompt_BT, 9, jax.random.key(5), temperature=1.0, top_p=0.9)
    c = generate(model, prompt_BT, 9, jax.random.key(6), temperature=1.0, top_p=0.9)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_eos_stops_a_row_and_pads_after_it(greedy_gpt):
    model, prompt_BT, free = greedy_gpt
    eos = int(free[0, 5])  # row 0 emits this as its third new token
    out = np.asarray(generate(model, prompt_BT, 9, jax.random.key(0), temperature=0.0,
                              eos_id=eos, pad_id=12))
    for row_free, row in zip(free, out):
        new_free, new = row_free[3:], row[3:]
        hits = np.flatnonzero(new_free == eos)
        stop = hits[0] + 1 if hits.size else len(new)
        np.testing.assert_array_equal(new[:stop], new_free[:stop])
        assert np.all(new[stop:] == 12)
    assert np.all(out[0, 6:] == 12)


def test_t5_generate_starts_from_decoder_start_and_stops_at_eos():
    """Greedy from the decoder start token, with and without the cache, against the obvious
    loop; the row that meets EOS pads after it, the others run to the end."""
    # untied: a tiny random tied T5 just echoes its start token; seed 5: rows that differ
    config = T5Config(**{**TINY, **dict(position="t5", decoder_start_id=2, eos_id=1, pad_id=0,
                                        tie_embeddings=False)})
    model = T5(config, rngs=nnx.Rngs(5))
    enc_BS = tokens(11, (3, 6), low=2).at[2, 4:].set(0)
    free = greedy_reference(model, np.full((3, 1), 2, np.int32), 6, enc_BS)
    # EOS: a token that some row emits and some row never does, so both cases occur
    eos = next(int(x) for x in free[:, 1:].ravel() if not np.all(np.any(free[:, 1:] == x, axis=1)))
    out = np.asarray(generate(model, enc_BS, 6, jax.random.key(0), temperature=0.0, eos_id=eos))
    uncached = generate(model, enc_BS, 6, jax.random.key(0), temperature=0.0, eos_id=eos,
                        use_cache=False)
    np.testing.assert_array_equal(out, uncached)
    chex.assert_shape(out, (3, 7))
    assert np.all(out[:, 0] == 2)
    for row_free, row in zip(free, out):
        hits = np.flatnonzero(row_free[1:] == eos)
        stop = 1 + (hits[0] + 1 if hits.size else 6)
        np.testing.assert_array_equal(row[:stop], row_free[:stop])
        assert np.all(row[stop:] == 0)  # config.pad_id


def test_zero_new_tokens_returns_the_prompt():
    prompt_BT = tokens(12, (2, 4))
    np.testing.assert_array_equal(generate(gpt(), prompt_BT, 0, jax.random.key(0)), prompt_BT)


# ---------------------------------------------------------------- bad lengths


def test_bad_lengths_are_value_errors():
    with pytest.raises(ValueError, match="prompt length 13 exceeds the model's max_len=12"):
        generate(gpt(position="rope"), tokens(0, (1, 13)), 1, jax.random.key(0))
    with pytest.raises(ValueError, match="runs past max_len=12 of the learned"):
        generate(gpt(position="learned"), tokens(0, (1, 5)), 8, jax.random.key(0))
    with pytest.raises(ValueError, match="runs past max_len=12 of the learned"):
        generate(t5(position="learned"), tokens(0, (1, 5)), 12, jax.random.key(0))
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        generate(t5(), tokens(0, (1, 13)), 2, jax.random.key(0))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(gpt(), tokens(0, (1, 2)), -1, jax.random.key(0))
    with pytest.raises(ValueError, match="at least one token"):
        generate(gpt(), jnp.zeros((2, 0), jnp.int32), 2, jax.random.key(0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(gpt(), tokens(0, (1, 2)) + 13, 2, jax.random.key(0))
    with pytest.raises(ValueError, match="eos_id=13"):
        generate(gpt(), tokens(0, (1, 2)), 2, jax.random.key(0), eos_id=13)
    with pytest.raises(TypeError, match="GPT and T5"):
        generate(object(), tokens(0, (1, 2)), 2, jax.random.key(0))


# ---------------------------------------------------------------- benchmark


@pytest.mark.slow
def test_mnist_config_and_benchmark_runs():
    cfg = decoding.mnist_gpt_config()
    assert (cfg.vocab_size, cfg.max_len, cfg.d_model, cfg.num_heads, cfg.num_layers, cfg.d_ff) == (
        17, 197, 128, 4, 4, 512)
    small = decoding.mnist_gpt_config(max_len=5, d_model=8, num_heads=2, num_layers=1, d_ff=8)
    result = decoding.benchmark(small, batch=2, new_tokens=4, repeats=1)
    for path in ("cache", "no_cache"):
        assert result[path]["tokens_per_s"] > 0 and result[path]["median_s"] > 0
    assert result["speedup"] > 0
