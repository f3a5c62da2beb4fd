"""Prompts of different lengths in one batch (`generate(..., prompt_lengths=)`): each row as if alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, generate
from txjax.config import positions_for
from txjax.decoding import shift_rows

jax.config.update("jax_numpy_rank_promotion", "raise")

TINY = dict(vocab_size=13, max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=32)
LENGTHS = np.array([5, 3, 1])
NEW = 6


def prompts(seed, width=5):
    """Three prompts, left-aligned in [3, width]; junk (not pad) after each length, which must be ignored."""
    return jnp.asarray(np.random.default_rng(seed).integers(1, TINY["vocab_size"], size=(3, width)), jnp.int32)


def greedy_alone(model, prompt_T, n, width):
    """Greedy the obvious way for one prompt alone: full forwards over a buffer of `width` (the
    model is causal, so the zeros after position i change nothing before it)."""
    forward = jax.jit(lambda seq: model(seq[None])[0])
    seq = np.zeros(width, np.int32)
    seq[: prompt_T.size] = prompt_T
    for i in range(prompt_T.size, prompt_T.size + n):
        seq[i] = np.argmax(forward(jnp.asarray(seq))[i - 1])
    return seq[: prompt_T.size + n]


@pytest.mark.parametrize("position", positions_for("gpt"))
def test_cached_logits_of_right_aligned_prompts_equal_each_alone(position):
    """The mechanism, logit by logit: prompts right-aligned after `start_B` slots of left padding,
    prefilled at once, then 3 tokens one per step; every real position's logits equal the row's
    own full forward, so positions count from each row's start and the padding is never seen."""
    model = GPT(GPTConfig(**TINY, position=position), rngs=nnx.Rngs(0))
    seq_BT = prompts(1, 8)  # row b: its first LENGTHS[b] + 3 tokens are real
    start_B = jnp.asarray(5 - LENGTHS, jnp.int32)
    aligned_BT = shift_rows(seq_BT, start_B, 0)
    cache = model.init_cache(3, 8).replace(start_B=start_B)

    @jax.jit
    def cached(aligned_BT, cache):
        logits_BTV, cache = model.decode_step(aligned_BT[:, :5], cache)
        steps = [logits_BTV]
        for i in range(5, 8):
            step_BTV, cache = model.decode_step(aligned_BT[:, i:i + 1], cache)
            steps.append(step_BTV)
        return jnp.concatenate(steps, axis=1)

    logits_BTV = cached(aligned_BT, cache)
    for b, (start, n) in enumerate(zip(5 - LENGTHS, LENGTHS + 3)):
        np.testing.assert_allclose(logits_BTV[b, start:], model(seq_BT[b:b + 1, :n])[0], atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("position", positions_for("gpt"))
def test_gpt_rows_of_different_lengths_generate_as_alone(position):
    model = GPT(GPTConfig(**TINY, position=position), rngs=nnx.Rngs(0))
    prompt_BT = prompts(2)
    alone = [greedy_alone(model, np.asarray(prompt_BT[b, :n]), NEW, 5 + NEW) for b, n in enumerate(LENGTHS)]
    for use_cache in (True, False):
        out_BL = generate(model, prompt_BT, NEW, jax.random.key(0), temperature=0.0, use_cache=use_cache,
                          prompt_lengths=LENGTHS)
        assert out_BL.shape == (3, 5 + NEW)
        for b, n in enumerate(LENGTHS):
            np.testing.assert_array_equal(out_BL[b, : n + NEW], alone[b], err_msg=f"row {b}, cache {use_cache}")
            np.testing.assert_array_equal(out_BL[b, n + NEW:], 0)  # filled after the row's own tokens


@pytest.mark.slow
@pytest.mark.parametrize("position", ["t5", "rope", "learned"])
def test_t5_encoder_inputs_of_different_lengths_decode_as_alone(position):
    """The encoder reads each row's first L_b tokens only (a padding mask, no pad id needed); one
    encoding of each kind (relative bias, rotary, absolute table), as the mask is the same for all."""
    model = T5(T5Config(**TINY, position=position), rngs=nnx.Rngs(0))
    enc_BS = prompts(3)
    start = model.config.decoder_start_id
    for use_cache in (True, False):
        out_BL = generate(model, enc_BS, NEW, jax.random.key(0), temperature=0.0, use_cache=use_cache,
                          prompt_lengths=LENGTHS, eos_id=None)
        for b, n in enumerate(LENGTHS):
            forward = jax.jit(lambda dec, enc=enc_BS[b:b + 1, :n]: model(enc, dec[None])[0])
            seq = np.full(1 + NEW, start, np.int32)
            for i in range(1, 1 + NEW):
                seq[i] = np.argmax(forward(jnp.asarray(seq))[i - 1])
            np.testing.assert_array_equal(out_BL[b], seq, err_msg=f"row {b}, cache {use_cache}")


def test_full_lengths_equal_no_lengths_and_zero_new_tokens_returns_each_prompt():
    model = GPT(GPTConfig(**TINY, position="rope", pad_id=0), rngs=nnx.Rngs(0))
    prompt_BT = prompts(4)
    np.testing.assert_array_equal(
        generate(model, prompt_BT, 3, jax.random.key(1), prompt_lengths=[5, 5, 5]),
        generate(model, prompt_BT, 3, jax.random.key(1)))
    out_BT = generate(model, prompt_BT, 0, jax.random.key(0), prompt_lengths=LENGTHS)
    np.testing.assert_array_equal(out_BT, np.where(np.arange(5)[None] < LENGTHS[:, None], prompt_BT, 0))


@pytest.mark.parametrize("lengths, match", [
    ([5, 0, 1], "must lie in \\[1, 5\\]"),
    ([5, 6, 1], "must lie in \\[1, 5\\]"),
    ([5, 3], "must be 3 integers"),
    ([5.0, 3.0, 1.0], "must be 3 integers"),
])
def test_bad_prompt_lengths_are_clear_errors(lengths, match):
    model = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=match):
        generate(model, prompts(0), 2, jax.random.key(0), prompt_lengths=jnp.asarray(lengths))
