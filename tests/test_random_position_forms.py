"""The other forms of random positions, after the forms Ruoss et al.'s code gives an encoding.

distances (its ALiBi, `compute_noisy_alibi_encodings_biases`; here also T5's bias and KERPLE): a
random distance per offset, the same for every query of a row, where random positions give each
pair its own; drawn once for the stack, or per attention layer as its code does (layer_distances).
layers (its RoPE, drawn inside each attention layer): every attention layer draws its own positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, Bert, BertConfig, GPTConfig, decoding, ops
from txjax.nn.positions import Positions
from txjax.train.config import TrainConfig
from txjax.train.steps import Stepper, fresh_rngs, gpt_loss

TINY = dict(vocab_size=13, max_len=32, d_model=16, num_heads=2, num_layers=2, d_ff=32, position="alibi")
DISTANCES = dict(random_positions=24, random_positions_form="distances")


def draw_fn(jit):
    return jax.jit(ops.random_distances, static_argnums=(1, 2, 3)) if jit else ops.random_distances


@pytest.mark.parametrize("jit", [False, True])
def test_a_distance_per_offset_zero_then_sorted_distinct_in_range(jit):
    d = np.asarray(draw_fn(jit)(jax.random.key(0), 500, 6, 12))
    assert d.shape == (500, 6) and d.dtype == np.int32
    np.testing.assert_array_equal(d[:, 0], 0)  # a token is at distance 0 from itself
    assert np.all(np.diff(d, axis=1) > 0) and d.max() < 12  # offsets 1..5: distinct, sorted, in [1, 12)
    assert set(np.unique(d[:, 1:])) == set(range(1, 12))  # every distance of the range is drawn
    np.testing.assert_array_equal(d, draw_fn(jit)(jax.random.key(0), 500, 6, 12))
    assert not np.array_equal(d, draw_fn(jit)(jax.random.key(1), 500, 6, 12))
    np.testing.assert_array_equal(ops.random_distances(jax.random.key(0), 3, 1, 12), 0)
    with pytest.raises(ValueError, match="max_distance >= 13"):
        ops.random_distances(jax.random.key(0), 1, 13, 12)


@pytest.mark.parametrize("jit", [False, True])
def test_a_padded_row_draws_its_offsets_as_if_alone(jit):
    """A 2-token row's one distance is uniform over [1, R) (E = R / 2), padded or not; the first of
    5 sorted draws would crowd low (E = R / 6); entries beyond the row's offsets are 0."""
    lengths = np.array([2, 4] * 2000)
    d = np.asarray(draw_fn(jit)(jax.random.key(0), 4000, 6, 12, jnp.asarray(lengths)))
    np.testing.assert_array_equal(d[lengths == 2, 2:], 0)
    np.testing.assert_array_equal(d[lengths == 4, 4:], 0)
    assert np.all(np.diff(d[lengths == 4, :4], axis=1) > 0)
    pair = d[lengths == 2, 1]
    np.testing.assert_allclose(np.bincount(pair, minlength=12)[1:] / len(pair), 1 / 11, atol=0.03)
    assert abs(pair.mean() - 6.0) < 0.2


@pytest.mark.parametrize("directional", [False, True])
def test_alibi_with_distances_is_the_formula_and_depends_on_the_offset_alone(directional):
    """bias[b, n, i, j] = -m_n * (D_b[|i - j|] - 0.5 [j < i, directional]); D_b[r] = r is plain ALiBi."""
    d_BR = ops.random_distances(jax.random.key(2), 3, 7, 50)
    t = jnp.arange(7)
    bias = np.asarray(ops.alibi_bias(4, t, t, directional, d_BR))
    assert bias.shape == (3, 4, 7, 7)
    slopes = np.asarray(ops.alibi_slopes(4))
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    for b in range(3):
        distance = np.asarray(d_BR[b])[np.abs(i - j)] - 0.5 * ((j < i) & directional)
        np.testing.assert_allclose(bias[b], -slopes[:, None, None] * distance[None], rtol=1e-6)
        for k in range(-6, 7):  # Toeplitz: one value per diagonal
            assert len(np.unique(np.diagonal(bias[b], offset=k, axis1=1, axis2=2), axis=1)[0]) == 1
    identity = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (3, 7))
    np.testing.assert_array_equal(ops.alibi_bias(4, t, t, directional, identity),
                                  np.broadcast_to(ops.alibi_bias(4, t, t, directional), bias.shape))


@pytest.mark.parametrize("jit", [False, True])
def test_random_offsets_keep_the_sign_and_move_the_magnitude(jit):
    """offset' = sign(o) * D_b[|o|]; D_b[r] = r gives the offsets back; None leaves them."""
    d_BR = ops.random_distances(jax.random.key(3), 2, 6, 40)
    offset_1TS = ops.relative_positions(jnp.arange(6), jnp.arange(6))
    fn = jax.jit(ops.random_offsets) if jit else ops.random_offsets
    moved = np.asarray(fn(offset_1TS, d_BR))
    o = np.asarray(offset_1TS[0])
    for b in range(2):
        np.testing.assert_array_equal(moved[b], np.sign(o) * np.asarray(d_BR[b])[np.abs(o)])
    identity = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    np.testing.assert_array_equal(fn(offset_1TS, identity), np.broadcast_to(o, (2, 6, 6)))
    assert ops.random_offsets(offset_1TS, None) is offset_1TS


def relative_bias(position, directional=False):
    """The stack's bias module of a tiny encoder with `position` (T5's buckets, or KERPLE)."""
    config = BertConfig(**{**TINY, "position": position}, **DISTANCES, directional_bias=directional)
    return Positions(config, bidirectional=True, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("position, directional", [("t5", False), ("kerple", False), ("kerple", True)])
@pytest.mark.parametrize("jit", [False, True])
def test_t5_and_kerple_with_distances_are_their_bias_at_the_moved_offsets(position, directional, jit):
    """T5's bias is its table at bucket(sign(o) D_b[|o|]); KERPLE's -r1 log(1 + r2 D_b[|o|]), with
    r1, r2 still chosen by the key's side; one value per diagonal; D_b[r] = r is the plain bias."""
    positions = relative_bias(position, directional)
    d_BR = ops.random_distances(jax.random.key(4), 3, 7, 60)
    t = jnp.arange(7)
    fn = jax.jit(positions.attention_bias) if jit else positions.attention_bias
    bias = np.asarray(fn(t, t, d_BR))
    assert bias.shape == (3, 2, 7, 7)
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    o = j - i
    for b in range(3):
        moved = np.sign(o) * np.asarray(d_BR[b])[np.abs(o)]
        if position == "t5":
            bucket = np.asarray(ops.t5_relative_position_bucket(jnp.asarray(moved), True, 32, 128))
            expected = np.asarray(positions.relative.table[...])[bucket].transpose(2, 0, 1)
        else:
            r1, r2 = (np.asarray(r) for r in (positions.relative.r1, positions.relative.r2))
            if directional:
                side = (o > 0).astype(int)
                r1, r2 = r1[side].transpose(2, 0, 1), r2[side].transpose(2, 0, 1)
            else:
                r1, r2 = r1[:, None, None], r2[:, None, None]
            expected = -r1 * np.log1p(r2 * np.abs(moved)[None])
        np.testing.assert_allclose(bias[b], expected, rtol=1e-6, atol=1e-7)
        for k in range(-6, 7):  # a function of the offset alone: one value per diagonal
            assert len(np.unique(np.diagonal(bias[b], offset=k, axis1=1, axis2=2), axis=1)[0]) == 1
    identity = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (3, 7))
    np.testing.assert_array_equal(positions.attention_bias(t, t, identity),
                                  np.broadcast_to(positions.attention_bias(t, t), bias.shape))


@pytest.mark.parametrize("position", ["t5", "kerple"])
def test_an_encoder_with_t5_or_kerple_distances_draws_them_in_training_and_learns_the_bias(position):
    m = Bert(BertConfig(**{**TINY, "position": position}, **DISTANCES), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (3, 6)), jnp.int32)
    positions = split(m)(jax.random.key(0)).encoder.positions
    drawn = positions.distances(3, 6)
    assert drawn.shape == (3, 6) and np.all(np.diff(np.asarray(drawn), axis=1) > 0)
    t = jnp.arange(6)
    assert not np.allclose(positions.attention_bias(t, t, drawn), positions.attention_bias(t, t))
    assert nnx.view(m, deterministic=True, raise_if_not_found=False).encoder.positions.distances(3, 6) is None
    grads = nnx.grad(lambda mm: jnp.sum(mm(tokens) ** 2))(split(m)(jax.random.key(1)))
    relative = nnx.state(grads.encoder.positions.relative, nnx.Param)
    assert all(np.isfinite(x).all() and np.abs(x).sum() > 0 for x in jax.tree.leaves(relative))


def spy_on(monkeypatch, method: str) -> list:
    """Every value `Positions.<method>` returns from now on (None, or the draw as an array)."""
    drawn, original = [], getattr(Positions, method)

    def spy(self, *args):
        out = original(self, *args)
        drawn.append(None if out is None else np.asarray(out))
        return out

    monkeypatch.setattr(Positions, method, spy)
    return drawn


def split(m):
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    return lambda key: nnx.merge(graphdef, params, fresh_rngs(rest, key))  # as the train step does


def test_drawn_while_training_per_step_off_in_evaluation_and_positions_stay_plain():
    m = Bert(BertConfig(**TINY, **DISTANCES), rngs=nnx.Rngs(0))
    plain = Bert(BertConfig(**TINY), rngs=nnx.Rngs(0))
    assert m.random_positions is None and plain.encoder.positions.random_distances is None
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (3, 6)), jnp.int32)
    train = split(m)
    a, b, again = (np.asarray(train(k).encoder.positions.distances(3, 6)) for k in map(jax.random.key, (0, 1, 0)))
    assert a.shape == (3, 6) and np.all(np.diff(a, axis=1) > 0) and a.max() < 24
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, again)
    np.testing.assert_array_equal(train(jax.random.key(0)).positions(tokens), np.arange(6))
    evaluated = nnx.view(m, deterministic=True, raise_if_not_found=False)
    assert evaluated.encoder.positions.distances(3, 6) is None
    nnx.update(plain, nnx.state(m, nnx.Param))  # the same parameters
    plain_eval = nnx.view(plain, deterministic=True, raise_if_not_found=False)
    np.testing.assert_allclose(evaluated(tokens), plain_eval(tokens), rtol=1e-6, atol=1e-6)
    asked = Bert(BertConfig(**TINY, **DISTANCES, random_positions_eval=True), rngs=nnx.Rngs(0))
    assert nnx.view(asked, deterministic=True, raise_if_not_found=False).encoder.positions.distances(3, 6).shape == (3, 6)


def test_padding_does_not_change_a_rows_distances():
    """Padded to 12 or 20 tokens, a 3-token row's distance at offset 2 averages 2 R / 3 (the larger of
    two draws from [1, R)), as unpadded; pads do not change the real tokens' training loss either."""
    m = Bert(BertConfig(**TINY, **DISTANCES, pad_id=0), rngs=nnx.Rngs(0))
    positions = split(m)(jax.random.key(0)).encoder.positions
    for width in (3, 12, 20):
        valid = jnp.zeros((2000, width), bool).at[:, :3].set(True)
        d = np.asarray(positions.distances(2000, width, valid))
        assert np.all(np.diff(d[:, :3], axis=1) > 0)
        assert abs(d[:, 2].mean() - (2 * 24 / 3)) < 0.3, (width, d[:, 2].mean())


@pytest.mark.parametrize("form", ["distances", "layer_distances"])
@pytest.mark.parametrize("jit", [False, True])
def test_a_causal_stack_with_distances_never_reads_ahead_and_trains(form, jit):
    m = GPT(GPTConfig(**TINY, **dict(DISTANCES, random_positions_form=form)), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 8)), jnp.int32)
    train = split(m)

    def logit_3(x_BTD):
        mm = train(jax.random.key(5))
        positions = mm.positions(tokens)
        h, _ = mm.decoder(x_BTD, positions)
        return jnp.sum(mm.logits(h)[:, 3])

    grad = (jax.jit(jax.grad(logit_3)) if jit else jax.grad(logit_3))(m.embed(tokens))
    np.testing.assert_array_equal(grad[:, 4:], 0.0)
    assert np.abs(grad[:, :4]).sum() > 0
    stepper = Stepper(m, gpt_loss, TrainConfig(batch_size=2, steps=1, warmup_steps=0))
    _, metrics = stepper.train_step(stepper.init_state(), {"inputs": tokens, "targets": tokens}, jax.random.key(0))
    assert np.isfinite(float(metrics["loss"]))


def test_cached_decoding_does_not_draw():
    """A cache is filled one call at a time, so a draw per call could not hold; decoding reads the
    plain distances, with or without the cache."""
    m = GPT(GPTConfig(**TINY, **DISTANCES), rngs=nnx.Rngs(0))
    prompt = jnp.asarray([[3, 4, 5]], jnp.int32)
    cached, full = (decoding.generate(m, prompt, 5, key=jax.random.key(0), temperature=0.0, use_cache=c)
                    for c in (True, False))
    np.testing.assert_array_equal(cached, full)


def test_the_form_is_validated():
    for position in ("rope", "fire", "learned"):  # FIRE's normaliser reads the query's position, not an offset
        for form in ("distances", "layer_distances"):
            with pytest.raises(ValueError, match="random distance per offset"):
                BertConfig(**{**TINY, "position": position}, random_positions=24, random_positions_form=form)
    fire = Positions(BertConfig(**{**TINY, "position": "fire"}), bidirectional=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="normaliser"):
        fire.attention_bias(jnp.arange(4), jnp.arange(4), jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="random_positions_form"):
        BertConfig(**TINY, random_positions=24, random_positions_form="offsets")
    assert BertConfig(**TINY, random_positions_form="distances").random_positions is None  # off: nothing drawn
    for position in ("learned", "sinusoidal", "none"):
        with pytest.raises(ValueError, match="inside attention"):
            BertConfig(**{**TINY, "position": position}, random_positions=24, random_positions_form="layers")


@pytest.mark.parametrize("position", ["alibi", "t5", "kerple"])
@pytest.mark.parametrize("form, draws", [("distances", 1), ("layer_distances", 3)])
def test_distances_drawn_once_per_stack_or_once_per_layer_and_none_in_evaluation(position, form, draws, monkeypatch):
    drawn = spy_on(monkeypatch, "distances")
    cfg = BertConfig(**{**TINY, "position": position, "num_layers": 3}, random_positions=24, random_positions_form=form)
    m = Bert(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 7)), jnp.int32)
    assert np.isfinite(np.asarray(split(m)(jax.random.key(0))(tokens))).all()
    assert len(drawn) == draws and len({d.tobytes() for d in drawn}) == draws  # each draw its own
    for d in drawn:
        assert d.shape == (2, 7) and (d[:, 0] == 0).all() and np.all(np.diff(d, axis=1) > 0) and d.max() < 24
    drawn.clear()
    nnx.view(m, deterministic=True, raise_if_not_found=False)(tokens)
    assert drawn and all(d is None for d in drawn)


@pytest.mark.parametrize("position", ["alibi", "t5", "kerple"])
@pytest.mark.parametrize("jit", [False, True])
def test_with_layer_distances_layer_i_reads_draw_i(position, jit, monkeypatch):
    """The stack's output is its blocks run one by one, block i on the bias at the i-th draw."""
    cfg = BertConfig(**{**TINY, "position": position, "num_layers": 3}, random_positions=24,
                     random_positions_form="layer_distances")
    m = Bert(cfg, rngs=nnx.Rngs(0))
    stack = m.encoder
    draws = [ops.random_distances(jax.random.key(i), 2, 7, 24) for i in range(3)]
    calls = iter(range(10**6))
    monkeypatch.setattr(Positions, "distances", lambda self, *args: draws[next(calls) % 3])
    x_BTD = jax.random.normal(jax.random.key(9), (2, 7, cfg.d_model))
    t = jnp.arange(7)

    def by_stack(x_BTD):
        return stack(x_BTD, t)[0]

    def by_blocks(x_BTD, order=(0, 1, 2)):
        for block, i in zip(stack.blocks, order):
            x_BTD, _ = block(x_BTD, stack.self_bias(t, t, distances_BR=draws[i]), rotary=None, positions=t)
        return x_BTD if stack.final_norm is None else stack.final_norm(x_BTD)

    f, g = (jax.jit(fn) if jit else fn for fn in (by_stack, by_blocks))
    np.testing.assert_allclose(f(x_BTD), g(x_BTD), rtol=1e-6, atol=1e-6)
    assert not np.allclose(f(x_BTD), by_blocks(x_BTD, (1, 0, 2)), atol=1e-4)  # the order matters


LAYERS = dict(random_positions=24, random_positions_form="layers")


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
def test_every_layer_draws_its_own_positions_while_training_and_none_in_evaluation(position, monkeypatch):
    drawn = spy_on(monkeypatch, "layer_positions")
    cfg = BertConfig(**{**TINY, "position": position, "num_layers": 3}, **LAYERS)
    m = Bert(cfg, rngs=nnx.Rngs(0))
    assert m.random_positions is None
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 7)), jnp.int32)
    out = split(m)(jax.random.key(0))(tokens)
    assert len(drawn) == 3 and np.isfinite(np.asarray(out)).all()
    for p in drawn:
        assert p.shape == (2, 7) and np.all(np.diff(p, axis=1) > 0) and p.min() >= 0 and p.max() < 24
    assert len({p.tobytes() for p in drawn}) == 3  # three layers, three draws
    drawn.clear()
    evaluated = nnx.view(m, deterministic=True, raise_if_not_found=False)
    plain = Bert(BertConfig(**{**TINY, "position": position, "num_layers": 3}), rngs=nnx.Rngs(0))
    nnx.update(plain, nnx.state(m, nnx.Param))
    np.testing.assert_allclose(evaluated(tokens), nnx.view(plain, deterministic=True, raise_if_not_found=False)(tokens),
                               rtol=1e-6, atol=1e-6)
    assert len(drawn) == 4 and all(p is None for p in drawn)  # asked per layer, and once by the plain model: no draw


@pytest.mark.parametrize("changes", [LAYERS, dict(LAYERS, random_positions_per_batch=True),
                                     dict(random_positions=24, random_positions_per_batch=True)])
@pytest.mark.parametrize("jit", [False, True])
def test_a_causal_stack_drawing_per_layer_or_per_batch_never_reads_ahead(changes, jit):
    m = GPT(GPTConfig(**{**TINY, "position": "rope"}, **changes), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (2, 8)), jnp.int32)

    def logit_3(x_BTD):
        mm = split(m)(jax.random.key(5))
        h, _ = mm.decoder(x_BTD, mm.positions(tokens))
        return jnp.sum(mm.logits(h)[:, 3])

    grad = (jax.jit(jax.grad(logit_3)) if jit else jax.grad(logit_3))(m.embed(tokens))
    np.testing.assert_array_equal(grad[:, 4:], 0.0)
    assert np.abs(grad[:, :4]).sum() > 0
    if changes.get("random_positions_form") == "layers":
        with pytest.raises(ValueError, match="unpacked"):
            split(m)(jax.random.key(0))(tokens, document_ids_BT=jnp.zeros_like(tokens))
