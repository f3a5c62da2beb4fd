"""Bad token and segment ids in the models (issue 15): eager, a ValueError naming the range; under jit,
NaN logits at that position, never another id's row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config
from txjax.nn import Embed

TINY = dict(vocab_size=8, max_len=8, d_model=8, num_heads=2, num_layers=1, d_ff=16)


@pytest.mark.parametrize("bad", [-1, -8, 8, -9])
def test_embed_looks_out_of_range_ids_up_as_nan_under_jit(bad):
    """-1 used to embed as row V-1 (jnp.take wraps negative indices before mode="fill")."""
    embed = Embed(8, 4, rngs=nnx.Rngs(0))
    rows = jax.jit(lambda ids: embed(ids))(jnp.array([3, bad]))
    np.testing.assert_array_equal(rows[0], embed.embedding[...][3])
    assert np.all(np.isnan(rows[1]))


def jitted(model, *args):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))(state, *args)


def test_gpt_negative_id_under_jit_gives_nan_logits():
    """From its position on at least (its NaN key reaches earlier queries too: NaN + -inf is NaN)."""
    model = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    logits = jitted(model, jnp.array([[1, 2, -1, 3], [1, 2, 4, 3]]))
    assert np.all(np.isnan(logits[0, 2:])) and np.all(np.isfinite(logits[1]))
    with pytest.raises(ValueError, match=r"tokens has ids in \[-1, 3\], outside the vocabulary \[0, 8\)"):
        model(jnp.array([[1, 2, -1, 3]]))


@pytest.mark.parametrize("segment", [-1, 2])
def test_bert_bad_segment_id_under_jit_gives_nan_and_eagerly_an_error(segment):
    model = Bert(BertConfig(**TINY), rngs=nnx.Rngs(0))
    tokens, segments = jnp.array([[1, 2, 3]]), jnp.array([[0, segment, 1]])
    assert np.all(np.isnan(jitted(model, tokens, segments)))  # bidirectional: every position reads it
    assert np.all(np.isfinite(jitted(model, tokens, jnp.array([[0, 1, 1]]))))
    np.testing.assert_array_equal(model(tokens.tolist(), [[0, 1, 1]]), model(tokens, jnp.array([[0, 1, 1]])))
    with pytest.raises(ValueError, match=rf"segment_ids has ids in \[{min(segment, 0)}, {max(segment, 1)}\], "
                                         r"outside the vocabulary \[0, 2\)"):
        model(tokens, segments)


@pytest.fixture(scope="module")
def t5():
    return T5(T5Config(**TINY), rngs=nnx.Rngs(0))


def test_models_take_lists_of_ids(t5):
    gpt = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(gpt([[1, 2, 3]]), gpt(jnp.array([[1, 2, 3]])))
    np.testing.assert_array_equal(t5([[3, 4]], [[0, 5]]), t5(jnp.array([[3, 4]]), jnp.array([[0, 5]])))


def test_zero_length_sequences_give_empty_logits(t5):
    """Empty in, empty out (it used to fail in a max over zero keys); an empty T5 encoder input is
    cross-attended as fully masked (zeros)."""
    empty = jnp.zeros((2, 0), jnp.int32)
    assert GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))(empty).shape == (2, 0, 8)
    logits = t5(empty, jnp.ones((2, 3), jnp.int32))
    assert logits.shape == (2, 3, 8) and np.all(np.isfinite(logits))
    assert t5(jnp.ones((2, 3), jnp.int32), empty).shape == (2, 0, 8)
