"""Randomized positions (Ruoss et al. 2023), per-row positions through every encoding, and the
two handicaps of the studies made visible: sinusoidal scale and T5's max_distance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, ops, scoring
from txjax.decoding import generate
from txjax.config import POSITIONS
from txjax.train.config import TrainConfig
from txjax.train.steps import Stepper, fresh_rngs, gpt_loss

TINY = dict(vocab_size=13, max_len=32, d_model=16, num_heads=2, num_layers=2, d_ff=32)


@pytest.mark.parametrize("jit", [False, True])
def test_random_positions_are_sorted_distinct_in_range_and_reproducible(jit):
    draw = jax.jit(ops.random_positions, static_argnums=(1, 2, 3)) if jit else ops.random_positions
    p = np.asarray(draw(jax.random.key(0), 64, 10, 40))
    assert p.shape == (64, 10) and p.dtype == np.int32
    assert np.all(np.diff(p, axis=1) > 0)  # sorted and distinct
    assert p.min() >= 0 and p.max() < 40
    assert len({tuple(r) for r in p}) > 60  # rows differ
    np.testing.assert_array_equal(p, draw(jax.random.key(0), 64, 10, 40))
    assert not np.array_equal(p, draw(jax.random.key(1), 64, 10, 40))
    # every position of the range is drawn: the point of the method
    assert set(np.unique(p)) == set(range(40))
    with pytest.raises(ValueError, match="max_position >= 11"):
        ops.random_positions(jax.random.key(0), 1, 11, 10)


def test_uniform_over_subsets():
    """Each position of [0, R) is in a row's draw with probability T / R."""
    p = np.asarray(ops.random_positions(jax.random.key(3), 4000, 4, 8))
    freq = np.bincount(p.ravel(), minlength=8) / 4000
    np.testing.assert_allclose(freq, 4 / 8, atol=0.03)


@pytest.mark.parametrize("jit", [False, True])
def test_draws_equal_the_argsort_of_uniform_keys(jit):
    """The positions are the indices of a row's `length` smallest uniform keys, taken in the order
    of a stable argsort (lower index first on ties: float32 keys tie in ~1 row of 4 at R = 2048)."""
    draw = jax.jit(ops.random_positions, static_argnums=(1, 2, 3)) if jit else ops.random_positions
    lengths = jnp.asarray(np.random.default_rng(0).integers(1, 81, 64))
    for seed in range(8):
        key = jax.random.key(seed)
        ranks = np.argsort(np.asarray(jax.random.uniform(key, (64, 2048))), axis=-1, kind="stable")[:, :80]
        np.testing.assert_array_equal(draw(key, 64, 80, 2048), np.sort(ranks, axis=-1))
        kept = np.arange(80)[None, :] < np.asarray(lengths)[:, None]
        expected = np.where(kept, np.sort(np.where(kept, ranks, 2048), axis=-1), 0)
        np.testing.assert_array_equal(draw(key, 64, 80, 2048, lengths), expected)


def model(family, **changes):
    cls, cfg = {"gpt": (GPT, GPTConfig), "bert": (Bert, BertConfig), "t5": (T5, T5Config)}[family]
    return cls(cfg(**{**TINY, **changes}), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
def test_drawn_while_training_per_step_and_off_in_evaluation(family):
    m = model(family, random_positions=24)
    tokens = jnp.ones((3, 6), jnp.int32)
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    train = lambda key: nnx.merge(graphdef, params, fresh_rngs(rest, key))  # noqa: E731  as the train step does
    a, b, again = (np.asarray(train(k).positions(tokens)) for k in map(jax.random.key, (0, 1, 0)))
    assert a.shape == (3, 6) and np.all(np.diff(a, axis=1) > 0) and a.max() < 24
    assert not np.array_equal(a, b)  # another step, other positions
    np.testing.assert_array_equal(a, again)  # the seed reproduces them
    evaluated = nnx.view(m, deterministic=True, raise_if_not_found=False)
    np.testing.assert_array_equal(evaluated.positions(tokens), np.arange(6))
    asked = model(family, random_positions=24, random_positions_eval=True)
    assert nnx.view(asked, deterministic=True, raise_if_not_found=False).positions(tokens).shape == (3, 6)
    assert model(family).random_positions is None  # off by default: the parameters are those of before


@pytest.mark.parametrize("position", POSITIONS)
def test_every_encoding_trains_on_random_positions_and_stays_causal(position):
    """Per-row positions reach tables, RoPE and relative biases; a later token never leaks."""
    m = model("gpt", position=position, random_positions=32)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 8)), jnp.int32)
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)

    def logit_3(x_BTD):
        mm = nnx.merge(graphdef, params, fresh_rngs(rest, jax.random.key(5)))
        positions = mm.positions(tokens)
        h, _ = mm.decoder(mm.decoder.embed_positions(x_BTD, positions), positions)
        return jnp.sum(mm.logits(h)[:, 3])

    grad = jax.grad(logit_3)(m.embed(tokens))
    np.testing.assert_array_equal(grad[:, 4:], 0.0)
    assert np.abs(grad[:, :4]).sum() > 0
    stepper = Stepper(m, gpt_loss, TrainConfig(batch_size=2, steps=2, warmup_steps=0))
    state, metrics = stepper.train_step(stepper.init_state(), {"inputs": tokens, "targets": tokens},
                                        jax.random.key(0))
    assert np.isfinite(float(metrics["loss"]))


@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_per_row_relative_biases_equal_each_row_alone(kind):
    q = jnp.asarray([[0, 3, 4, 9], [1, 2, 6, 7]])
    if kind == "alibi":
        bias = lambda qp, kp: ops.alibi_bias(2, qp, kp)  # noqa: E731
    else:
        stack = model("t5", position="t5").encoder
        bias = stack.positions.attention_bias
    rows = bias(q, q)
    assert rows.shape == (2, 2, 4, 4)
    for b in range(2):
        np.testing.assert_allclose(rows[b], bias(q[b], q[b])[0], rtol=1e-6)


def test_causal_mask_from_per_row_positions():
    q = jnp.asarray([[0, 5, 7], [2, 3, 9]])
    mask = ops.attention_mask(q, q, causal=True)
    assert mask.shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(mask[:, 0], np.broadcast_to(np.tril(np.ones((3, 3), bool)), (2, 3, 3)))


def test_random_positions_config_is_validated():
    with pytest.raises(ValueError, match="random_positions"):
        GPTConfig(**TINY, random_positions=0)
    with pytest.raises(ValueError, match="learned table"):
        GPTConfig(**TINY, position="learned", random_positions=64)
    assert GPTConfig(**TINY, position="rope", random_positions=64).random_positions == 64


def test_scale_embeddings_multiplies_by_sqrt_d_before_positions():
    """Vaswani et al. 3.4: token embeddings times sqrt(d_model); the sinusoids stay in [-1, 1]."""
    plain, scaled = model("gpt", position="sinusoidal"), model("gpt", position="sinusoidal", scale_embeddings=True)
    tokens = jnp.asarray([[1, 2, 3]], jnp.int32)
    np.testing.assert_allclose(scaled.token_embeddings(tokens), plain.token_embeddings(tokens) * 4.0, rtol=1e-6)
    assert not np.allclose(scaled(tokens), plain(tokens))


@pytest.mark.parametrize("changes", [{"max_distance": 16}, {"max_distance": 8}, {"num_buckets": 2}])
def test_t5_bucket_arithmetic_must_be_defined(changes):
    """log(max_distance / max_exact) must be positive: max_distance > num_buckets // 2."""
    with pytest.raises(ValueError, match="max_distance"):
        T5Config(**TINY, **changes)
    assert T5Config(**TINY, max_distance=17).max_distance == 17


@pytest.mark.parametrize("jit", [False, True])
def test_padded_rows_draw_their_real_tokens_as_if_alone(jit):
    """With lengths, row b's first k entries are k sorted distinct draws spread over all of [0, R)
    (the first k of T sorted draws would crowd the low positions); the rest are 0."""
    draw = jax.jit(ops.random_positions, static_argnums=(1, 2, 3)) if jit else ops.random_positions
    lengths = np.array([1, 2] * 2000)
    p = np.asarray(draw(jax.random.key(0), 4000, 6, 8, jnp.asarray(lengths)))
    assert p.shape == (4000, 6) and p.dtype == np.int32
    np.testing.assert_array_equal(p[lengths == 1, 1:], 0)
    np.testing.assert_array_equal(p[lengths == 2, 2:], 0)
    assert np.all(p[lengths == 2, 1] > p[lengths == 2, 0])
    # a single real token is uniform over [0, 8): E = 3.5 (the first of 6 sorted draws: E = 9/7)
    singles = p[lengths == 1, 0]
    np.testing.assert_allclose(np.bincount(singles, minlength=8) / len(singles), 1 / 8, atol=0.03)
    # the larger of two draws from 0..R-1: E[max] = 2 (R + 1) / 3 - 1 = 5 (the second of 6 sorted draws: 18/7)
    assert abs(p[lengths == 2, 1].mean() - 5.0) < 0.1
    full = np.asarray(draw(jax.random.key(0), 4000, 6, 8, jnp.full((4000,), 6)))
    assert np.all(np.diff(full, axis=1) > 0)


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_padding_does_not_change_a_rows_random_positions(family):
    """An encoder row's real tokens get positions drawn over [0, R) as if the row were unpadded:
    padded to 12 or 20 tokens, a 3-token row's last position averages 3 (R + 1) / 4 - 1, not less."""
    m = model(family, random_positions=24)
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    train = nnx.merge(graphdef, params, fresh_rngs(rest, jax.random.key(0)))
    for width in (3, 12, 20):
        tokens = jnp.zeros((2000, width), jnp.int32).at[:, :3].set(5)  # pad id 0
        valid = tokens != 0
        p = np.asarray(train.positions(tokens, valid_BT=valid))
        assert np.all(np.diff(p[:, :3], axis=1) > 0)
        assert abs(p[:, 2].mean() - (3 * 25 / 4 - 1)) < 0.4, (width, p[:, 2].mean())
        np.testing.assert_array_equal(p[:, 3:], np.repeat(p[:, 2:3], width - 3, axis=1))


@pytest.mark.parametrize("form", ["positions", "distances", "layers"])
def test_scoring_and_decoding_read_plain_positions_from_a_model_left_in_training_mode(form):
    """Like dropout, random positions are a training-time draw: `score` and `generate` (cached or
    not) of a model in training mode compute what its evaluation view computes."""
    m = model("gpt", position="alibi", random_positions=24, random_positions_form=form)
    prompt = jnp.asarray([[3, 4, 5, 6, 7, 8]], jnp.int32)
    in_training = scoring.score(m, prompt, prompt)
    greedy = [generate(m, prompt, 6, key=jax.random.key(0), temperature=0.0, use_cache=c) for c in (True, False)]
    m.eval()
    for a, b in zip(jax.tree.leaves(in_training), jax.tree.leaves(scoring.score(m, prompt, prompt)), strict=True):
        np.testing.assert_array_equal(a, b)
    for tokens in greedy:
        np.testing.assert_array_equal(tokens, generate(m, prompt, 6, key=jax.random.key(0), temperature=0.0))
