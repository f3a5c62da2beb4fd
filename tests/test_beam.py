"""Beam search and scoring: num_beams=1 is greedy, score is a log_softmax gather, bad input is clear.

transformers' beam search as the oracle is in tests/test_beam_parity.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, beam_search, generate, score

jax.config.update("jax_numpy_rank_promotion", "raise")

V = 97
STEPS = 8


def tiny_gpt(**changes):
    return GPT(GPTConfig(vocab_size=V, max_len=32, d_model=32, num_heads=2, num_layers=2, d_ff=64, **changes),
               rngs=nnx.Rngs(0))


def tiny_t5():
    return T5(T5Config(vocab_size=V, max_len=32, d_model=32, num_heads=2, num_layers=2, d_ff=64), rngs=nnx.Rngs(0))


def prompts(b=3, t=5, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, V, (b, t)), jnp.int32)


@pytest.mark.parametrize("family", ["gpt", "t5"])
def test_one_beam_is_greedy(family):
    model, prompt = (tiny_gpt(), prompts()) if family == "gpt" else (tiny_t5(), prompts())
    want = generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0)
    got, score_B = beam_search(model, prompt, STEPS, num_beams=1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert score_B.shape == (3,) and bool(jnp.all(score_B < 0))


def test_one_beam_is_greedy_through_eos():
    model, prompt = tiny_gpt(), prompts()
    free = np.asarray(generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0))
    eos = int(free[0, 5 + 2])
    want = generate(model, prompt, STEPS, jax.random.key(0), temperature=0.0, eos_id=eos)
    got, _ = beam_search(model, prompt, STEPS, num_beams=1, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_input_is_a_clear_error():
    model, prompt = tiny_gpt(), prompts()
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(model, prompt, 4, num_beams=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(model, prompt, -1, num_beams=2)
    with pytest.raises(ValueError, match="max_len"):
        beam_search(model, prompt, 40, num_beams=2)
    with pytest.raises(ValueError, match="mask shape"):
        score(model, prompt, prompt, mask_BC=jnp.ones((3, 2), bool))


def test_zero_new_tokens_returns_the_prompt():
    model, prompt = tiny_gpt(), prompts()
    tokens, score_B = beam_search(model, prompt, 0, num_beams=3)
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(prompt))
    np.testing.assert_array_equal(np.asarray(score_B), np.zeros(3))


def test_beam_search_compiles_once():
    from txjax import beam as beam_module

    model = tiny_gpt()
    beam_search(model, prompts(seed=1), STEPS, num_beams=3)
    size = beam_module._beam_loop._cache_size()
    beam_search(model, prompts(seed=2), STEPS, num_beams=3)
    assert beam_module._beam_loop._cache_size() == size


def test_score_is_the_log_prob_of_the_beam_and_beats_greedy():
    """With length_penalty 0 and no EOS every beam has the same length: the score is the log-prob
    of the returned sequence under `score`, and 4 beams find one at least as likely as greedy."""
    model, prompt = tiny_gpt(), prompts()
    s1 = beam_search(model, prompt, STEPS, num_beams=1, length_penalty=0.0)[1]
    tokens, s4 = beam_search(model, prompt, STEPS, num_beams=4, length_penalty=0.0)
    assert bool(jnp.all(s4 >= s1 - 1e-5))
    np.testing.assert_allclose(np.asarray(score(model, prompt, tokens[:, 5:]).total_B), np.asarray(s4), atol=1e-4)


# ----------------------------------------------------------------------------- scoring


def hand_score(logits_fn, targets_BC):
    logp_BCV = jax.nn.log_softmax(logits_fn().astype(jnp.float32), axis=-1)
    b, c = targets_BC.shape
    return np.array([[float(logp_BCV[i, j, targets_BC[i, j]]) for j in range(c)] for i in range(b)])


def test_score_matches_a_hand_loop_with_padding():
    model, prompt, cont = tiny_gpt(), prompts(t=4), prompts(t=5, seed=3)
    mask = jnp.arange(5)[None, :] < jnp.array([5, 3, 1])[:, None]
    out = score(model, prompt, cont, mask_BC=mask)
    full = jnp.concatenate([prompt, cont], axis=1)
    want = hand_score(lambda: model(full)[:, 3:8], cont) * np.asarray(mask)
    np.testing.assert_allclose(np.asarray(out.logp_BC), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.total_B), want.sum(1), atol=1e-5)
    # Padding tokens change nothing: row 1 alone, cut to its length, scores the same.
    alone = score(model, prompt[1:2], cont[1:2, :3])
    np.testing.assert_allclose(float(alone.total_B[0]), float(out.total_B[1]), atol=1e-5)


def test_score_t5_and_greedy_flag():
    model, enc = tiny_t5(), prompts(t=6)
    greedy = generate(model, enc, 4, jax.random.key(0), temperature=0.0, eos_id=V - 1)
    targets = greedy[:, 1:]
    out = score(model, enc, targets)
    dec = greedy[:, :-1]
    np.testing.assert_allclose(np.asarray(out.logp_BC), hand_score(lambda: model(enc, dec), targets), atol=1e-5)
    assert bool(jnp.all(out.greedy_B))
    other = targets.at[:, 0].set((targets[:, 0] + 1) % V)
    assert not bool(jnp.any(score(model, enc, other).greedy_B))
