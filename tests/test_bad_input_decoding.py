"""Bad input and non-finite logits in decoding (issue 15): never a real token id made up from NaN,
never an overflowing temperature, never pads continued as if they were text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, GPTConfig, T5Config, beam_search, generate
from txjax.decoding import sample_logits

TINY = dict(vocab_size=8, max_len=12, d_model=8, num_heads=2, num_layers=1, d_ff=16)
NAN, INF = float("nan"), float("inf")


def bad_rows():
    """Rows 0 and 2 are fine (row 2 has one finite logit); row 1 has a NaN, row 3 only -inf."""
    return jnp.array([[0.0, 2.0, 1.0, 0.5],
                      [0.0, NAN, 1.0, 0.5],
                      [-INF, -INF, 3.0, -INF],
                      [-INF, -INF, -INF, -INF]])


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=2),
                                      dict(temperature=1.0, top_p=0.9)], ids=["greedy", "sample", "top_k", "top_p"])
def test_rows_without_a_usable_logit_get_minus_one(settings):
    """They used to become token 0, eagerly and under jit alike."""
    for f in (sample_logits, jax.jit(sample_logits, static_argnames=("temperature", "top_k", "top_p"))):
        tokens = np.asarray(f(bad_rows(), jax.random.key(0), **settings))
        assert tokens[1] == -1 and tokens[3] == -1
        assert tokens[2] == 2 and 0 <= tokens[0] < 4


@pytest.mark.parametrize("temperature", [1e-39, 1e-7, 5e-324])
def test_temperatures_below_the_floor_are_refused(temperature):
    """1e-39 was neither greedy nor an error: logits / 1e-39 overflowed."""
    match = rf"temperature={temperature} is below the floor 1e-06 .* use 0 for greedy"
    with pytest.raises(ValueError, match=match):
        sample_logits(bad_rows()[:1], jax.random.key(0), temperature)
    with pytest.raises(ValueError, match=match):
        generate(GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0)), jnp.ones((1, 2), jnp.int32), 1, jax.random.key(0),
                 temperature=temperature)


def test_the_floor_itself_samples_as_greedy():
    logits = jnp.array([[0.0, 2.0, 1.0, 1.999]])
    assert int(sample_logits(logits, jax.random.key(0), 1e-6)[0]) == 1


def nan_model(cls, config):
    model = cls(config, rngs=nnx.Rngs(0))
    nnx.update(model, jax.tree.map(lambda p: p * NAN, nnx.state(model, nnx.Param)))
    return model


@pytest.mark.parametrize("use_cache, temperature", [(True, 0.0), (False, 1.0)])
def test_generate_on_a_model_with_nan_parameters_raises(use_cache, temperature):
    """It used to return a normal-looking sequence of token 0."""
    model = nan_model(GPT, GPTConfig(**TINY))
    with pytest.raises(FloatingPointError, match=r"rows \[0, 1\] .* no usable logit \(NaN, or all -inf\) .* "
                                                 r"new token 0"):
        generate(model, jnp.ones((2, 3), jnp.int32), 4, jax.random.key(0), temperature=temperature,
                 use_cache=use_cache)


def test_t5_generate_on_a_model_with_nan_parameters_raises():
    model = nan_model(T5, T5Config(**TINY))
    with pytest.raises(FloatingPointError, match=r"rows \[0\] .* no usable logit"):
        generate(model, jnp.ones((1, 3), jnp.int32), 2, jax.random.key(0), temperature=0.0)


def test_beam_search_on_a_model_with_nan_parameters_raises():
    model = nan_model(GPT, GPTConfig(**TINY))
    with pytest.raises(FloatingPointError, match=r"beam_search: rows \[0\] .* score is not finite"):
        beam_search(model, jnp.ones((1, 3), jnp.int32), 2, num_beams=2)


def test_a_pad_inside_a_gpt_prompt_without_prompt_lengths_is_refused():
    """Row [4, 0, 0] with pad 0 used to generate as if the pads were text."""
    model = GPT(GPTConfig(**TINY, pad_id=0), rngs=nnx.Rngs(0))
    prompt = jnp.array([[4, 5, 6], [4, 0, 0]])
    match = r"prompt row 1 holds pad_id=0 at position 1 .* pass prompt_lengths"
    with pytest.raises(ValueError, match=match):
        generate(model, prompt, 2, jax.random.key(0))
    with pytest.raises(ValueError, match=match):
        beam_search(model, prompt, 2, num_beams=2)
    with pytest.raises(ValueError, match=r"prompt row 1 holds pad_id=0 at position 1, inside its first 2 tokens"):
        generate(model, prompt, 2, jax.random.key(0), prompt_lengths=[3, 2])
    out = generate(model, prompt, 2, jax.random.key(0), temperature=0.0, prompt_lengths=[3, 1])
    assert out.shape == (2, 5)


def test_pads_are_fine_where_the_model_has_no_pad_id_or_reads_them_as_padding():
    """Without config.pad_id a GPT reads 0 as a token; a T5 encoder masks its right padding."""
    gpt = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    assert generate(gpt, jnp.array([[4, 0, 0]]), 1, jax.random.key(0)).shape == (1, 4)
    t5 = T5(T5Config(**TINY), rngs=nnx.Rngs(0))
    assert generate(t5, jnp.array([[4, 5, 0]]), 1, jax.random.key(0), temperature=0.0).shape == (1, 2)
