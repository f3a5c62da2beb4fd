"""Sampling: temperature, top-k and top-p filters against their definitions and hand cases;
draws against the softmax they sample (chi-square); bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from test_decoding import gpt, tokens  # the tiny GPT (vocabulary 13) and token draws of the decoding tests
from txjax import generate
from txjax.decoding import filter_logits, sample_logits

# Upper 0.1% points of the chi-square distribution (scipy.stats.chi2.ppf(0.999, df)).
CHI2_999 = {4: 18.467, 12: 32.909}


LOGITS_SHAPE = (4, 7)
logit_rows = st.lists(
    st.floats(-5.0, 5.0, allow_nan=False, allow_subnormal=False, width=32), min_size=28, max_size=28
).map(lambda xs: jnp.asarray(np.reshape(xs, LOGITS_SHAPE), jnp.float32))


@settings(max_examples=10, deadline=None, derandomize=True)
@given(logits=logit_rows, seed=st.integers(0, 2**31 - 1))
def test_cold_temperature_and_top_one_are_argmax(logits, seed):
    """As temperature -> 0 sampling becomes argmax; top_k=1 is argmax at any temperature."""
    key = jax.random.key(seed)
    greedy = jnp.argmax(logits, -1)
    np.testing.assert_array_equal(sample_logits(logits, key, temperature=0.0), greedy)
    np.testing.assert_array_equal(sample_logits(logits, key, temperature=5.0, top_k=1), greedy)
    # a clear winner (margin 0.01) at temperature 1e-5: any other token has prob <= 7e^-1000
    clear = logits.at[jnp.arange(4), greedy].add(0.01)
    np.testing.assert_array_equal(sample_logits(clear, key, temperature=1e-5), greedy)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(logits=logit_rows, k=st.integers(1, 7), p=st.floats(0.05, 1.0))
def test_filter_keeps_k_largest_then_a_nucleus(logits, k, p):
    kept_k = np.isfinite(filter_logits(logits, 1.0, top_k=k))
    assert np.all(kept_k.sum(-1) == k)
    kth = np.sort(np.asarray(logits), -1)[:, -k][:, None]
    assert np.all(np.asarray(logits)[kept_k].reshape(4, k) >= kth)
    kept = np.isfinite(filter_logits(logits, 1.0, top_k=k, top_p=p))
    assert np.all(kept <= kept_k) and np.all(kept.sum(-1) >= 1)
    probs = np.asarray(jax.nn.softmax(jnp.where(kept_k, logits, -jnp.inf), -1), np.float64)
    for row_p, row_kept in zip(probs, kept):
        mass = np.sort(row_p[row_kept])
        assert mass.sum() >= p - 1e-5  # reaches p ...
        assert mass.sum() - mass[0] < p + 1e-5  # ... and would not without its least likely token


def test_top_p_hand_case():
    """probs 0.1, 0.5, 0.05, 0.3, 0.05 (unsorted): the nucleus for p is the fewest most likely
    tokens whose mass reaches p."""
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.05, 0.3, 0.05]]))
    for p, expected in [
        (0.3, [1]),
        (0.5 - 1e-3, [1]),
        (0.6, [1, 3]),
        (0.79, [1, 3]),
        (0.85, [0, 1, 3]),
        (0.93, [0, 1, 2, 3]),  # ties at 0.05: the lower id ranks first
        (1.0, [0, 1, 2, 3, 4]),
    ]:
        kept = np.flatnonzero(np.isfinite(filter_logits(logits, 1.0, top_p=p)[0]))
        assert kept.tolist() == expected, (p, kept)


def test_top_k_hand_case_and_temperature_scaling():
    logits = jnp.array([[1.0, 4.0, 2.0, 4.0, 0.0]])
    out = filter_logits(logits, temperature=2.0, top_k=3)
    np.testing.assert_allclose(out, [[-np.inf, 2.0, 1.0, 2.0, -np.inf]])
    np.testing.assert_array_equal(filter_logits(logits, 1.0, top_k=1)[0] > -np.inf,
                                  [False, True, False, False, False])  # the argmax of a tie
    np.testing.assert_allclose(filter_logits(logits, 1.0, top_k=50), logits)  # k > V keeps all


def chi2(counts, probs):
    expected = probs * counts.sum()
    return float(np.sum((counts - expected) ** 2 / expected))


def test_temperature_sampling_matches_softmax_chi2():
    """20 000 draws from sample_logits against softmax(logits / 0.7): chi-square with df = 4
    below the 0.1% point 18.47; the same counts against tau = 1 are far above it."""
    logits = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0])
    n, tau = 20_000, 0.7
    draws = jax.jit(sample_logits, static_argnums=2)(
        jnp.broadcast_to(logits, (n, 5)), jax.random.key(0), tau)
    counts = np.bincount(np.asarray(draws), minlength=5)
    assert chi2(counts, np.asarray(jax.nn.softmax(logits / tau), np.float64)) < CHI2_999[4]
    assert chi2(counts, np.asarray(jax.nn.softmax(logits), np.float64)) > 10 * CHI2_999[4]


def test_generate_first_token_matches_model_softmax_chi2():
    """On a fixed tiny GPT, 4 000 generated first tokens against softmax(logits / 1.5) of its
    full forward: chi-square with df = V - 1 = 12 below the 0.1% point 32.91."""
    model = gpt(position="learned", tie_embeddings=False)
    n, tau = 4_000, 1.5
    prompt_BT = jnp.broadcast_to(tokens(13, (1, 3)), (n, 3))
    first = np.asarray(generate(model, prompt_BT, 1, jax.random.key(3), temperature=tau)[:, 3])
    graphdef, state = nnx.split(model)
    logits = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, prompt_BT[:1])[0, -1]
    probs = np.asarray(jax.nn.softmax(logits / tau), np.float64)
    assert chi2(np.bincount(first, minlength=13), probs) < CHI2_999[12]



@pytest.mark.parametrize("kwargs,match", [
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=-0.2), "top_p"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=-3), "top_k"),
    (dict(top_k=2.5), "top_k"),
])
def test_bad_sampling_settings_are_value_errors(kwargs, match):
    logits = jnp.zeros((1, 5))
    with pytest.raises(ValueError, match=match):
        sample_logits(logits, jax.random.key(0), **{"temperature": 1.0, **kwargs})
    with pytest.raises(ValueError, match=match):
        generate(gpt(), tokens(0, (1, 2)), 3, jax.random.key(0), **kwargs)
