"""FIRE and KERPLE: the papers' formulas at hand-computed points, positivity, symmetry, causality, jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, ops
from txjax.nn.positions import FireBias, KerpleBias

TINY = dict(vocab_size=23, max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=32)
JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])

# FIRE with c = 1, L = 3 and the MLP h = relu([x, 0.5 - x]), heads (h0 + 0.1, -h0 + 2 h1 - 0.2),
# so x(i, j) = log(1 + |i - j|) / log(1 + max(3, i, j)).
FIRE_W1 = jnp.array([[1.0, -1.0]])
FIRE_B1 = jnp.array([0.0, 0.5])
FIRE_W2 = jnp.array([[1.0, -1.0], [0.0, 2.0]])
FIRE_B2 = jnp.array([0.1, -0.2])
FIRE_Q, FIRE_K = jnp.array([1, 3, 7, 15]), jnp.array([0, 3, 12])
FIRE_EXPECTED = {  # (i, j): (head 0, head 1), with x in the comment
    (1, 0): (0.6, -0.7),              # x = log 2 / log 4 = 0.5 (the threshold L = 3 normalises)
    (3, 3): (0.1, 0.8),               # x = 0
    (3, 0): (1.1, -1.2),              # x = log 4 / log 4 = 1
    (7, 3): (0.873976, -0.973976),    # x = log 5 / log 8 = 0.773976
    (15, 12): (0.6, -0.7),            # x = log 4 / log 16 = 0.5
    (1, 12): (1.068794, -1.168794),   # x = log 12 / log 13 = 0.968794 (the later position 12 normalises)
}


def call(fn, jit, *args):
    return (jax.jit(fn) if jit else fn)(*args)


@JIT
def test_fire_bias_matches_the_formula(jit):
    bias = call(lambda q, k: ops.fire_bias(q, k, FIRE_W1, FIRE_B1, FIRE_W2, FIRE_B2, 1.0, 3.0),
                jit, FIRE_Q, FIRE_K)
    assert bias.shape == (1, 2, 4, 3)
    q, k = list(map(int, FIRE_Q)), list(map(int, FIRE_K))
    for (i, j), expected in FIRE_EXPECTED.items():
        np.testing.assert_allclose(bias[0, :, q.index(i), k.index(j)], expected, atol=1e-5)


@JIT
def test_linear_fire_is_one_weight_and_bias_per_head_of_the_same_input(jit):
    """fire_mlp_width=0: f is linear, b_h(i, j) = w_h x(i, j) + b_h with FIRE's x, here at the
    points above (w = (2, -1), b = (0.1, 0.3)); the module holds w2 [1, N] and b2, drawn as
    PyTorch's Linear(1, N) (U(-1, 1)), and nothing else but c and L."""
    bias = call(lambda q, k: ops.fire_bias(q, k, None, None, jnp.array([[2.0, -1.0]]), jnp.array([0.1, 0.3]),
                                           1.0, 3.0), jit, FIRE_Q, FIRE_K)
    x = {(1, 0): 0.5, (3, 3): 0.0, (3, 0): 1.0, (7, 3): 0.773976, (15, 12): 0.5, (1, 12): 0.968794}
    q, k = list(map(int, FIRE_Q)), list(map(int, FIRE_K))
    for (i, j), xij in x.items():
        np.testing.assert_allclose(bias[0, :, q.index(i), k.index(j)], (2 * xij + 0.1, -xij + 0.3), atol=1e-5)
    module = FireBias(GPTConfig(**TINY, position="fire", fire_mlp_width=0), rngs=nnx.Rngs(0))
    names = {str(path[-1]) for path, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))}
    assert names == {"w2", "b2", "c", "threshold_multiplier"} and module.w2.shape == (1, 2)
    assert np.abs(np.asarray(module.w2[...])).max() <= 1.0
    positions = jnp.arange(5)
    expected = ops.fire_bias(positions, positions, None, None, module.w2[...], module.b2[...], module.scale,
                             module.threshold)
    # jit against eager: the same formula, which XLA may fuse and round differently
    np.testing.assert_allclose(call(lambda p: module(p, p), jit, positions), expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="fire_mlp_width"):
        GPTConfig(**TINY, position="fire", fire_mlp_width=-1)


def test_fire_scale_enters_as_its_absolute_value():
    args = (FIRE_Q, FIRE_K, FIRE_W1, FIRE_B1, FIRE_W2, FIRE_B2)
    np.testing.assert_array_equal(ops.fire_bias(*args, -0.3, 3.0), ops.fire_bias(*args, 0.3, 3.0))


# KERPLE with r1 = (1, 0.5) and r2 = (1, 2) (log) or (0.5, 2) (power), at distances 0, 1, 3, 4.
KERPLE_EXPECTED = {
    "log": ((1.0, 0.5), (1.0, 2.0), {  # -r1 log(1 + r2 d)
        0: (0.0, 0.0), 1: (-0.693147, -0.549306), 3: (-1.386294, -0.972955), 4: (-1.609438, -1.098612)}),
    "power": ((1.0, 0.5), (0.5, 2.0), {  # -r1 d^r2
        0: (0.0, 0.0), 1: (-1.0, -0.5), 3: (-1.732051, -4.5), 4: (-2.0, -8.0)}),
}


@JIT
@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_bias_matches_the_formula(variant, jit):
    r1, r2, expected = KERPLE_EXPECTED[variant]
    q, k = jnp.array([4, 5]), jnp.array([0, 1, 2, 4, 5])
    bias = call(lambda q, k: ops.kerple_bias(q, k, jnp.array(r1), jnp.array(r2), variant), jit, q, k)
    assert bias.shape == (1, 2, 2, 5)
    for t, i in enumerate([4, 5]):
        for s, j in enumerate([0, 1, 2, 4, 5]):
            if abs(i - j) in expected:
                np.testing.assert_allclose(bias[0, :, t, s], expected[abs(i - j)], atol=1e-5)


def test_kerple_power_gradient_is_finite_at_distance_zero():
    q = jnp.arange(4)
    grad = jax.grad(lambda r2: ops.kerple_bias(q, q, jnp.ones(2), r2, "power").sum())(jnp.array([0.5, 1.5]))
    assert np.isfinite(grad).all() and (grad != 0).all()


def test_kerple_rejects_an_unknown_variant():
    with pytest.raises(ValueError, match="variant='exp'"):
        ops.kerple_bias(jnp.arange(3), jnp.arange(3), jnp.ones(2), jnp.ones(2), "exp")
    with pytest.raises(ValueError, match="kerple_variant='exp'"):
        GPTConfig(**TINY, position="kerple", kerple_variant="exp")


@pytest.mark.parametrize("fn", ["fire", "kerple"])
def test_per_row_positions_give_per_row_biases(fn):
    config = GPTConfig(**TINY, position=fn)
    module = (FireBias if fn == "fire" else KerpleBias)(config, rngs=nnx.Rngs(0))
    q_BT = jnp.array([[0, 1, 2, 3], [5, 6, 7, 8]])
    k_BS = jnp.array([[0, 1, 2, 3, 4], [0, 3, 6, 9, 12]])
    bias_BNTS = module(q_BT, k_BS)
    assert bias_BNTS.shape == (2, 2, 4, 5)
    for b in range(2):
        np.testing.assert_allclose(bias_BNTS[b], module(q_BT[b], k_BS[b])[0], rtol=1e-6)
    assert module(q_BT, jnp.arange(5)).shape == (2, 2, 4, 5)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_r1_r2_positive_at_init_and_for_any_raw_value(variant):
    config = GPTConfig(**{**TINY, "d_model": 64, "num_heads": 64}, position="kerple", kerple_variant=variant)
    module = KerpleBias(config, rngs=nnx.Rngs(0))
    r1_max, r2_max = (2.0, 1.0) if variant == "log" else (1.0, 2.0)  # the reference code's U(0, max) draws
    assert (module.r1 > 0).all() and (module.r1 < r1_max).all()
    assert (module.r2 > 0).all() and (module.r2 < r2_max).all()
    for raw in (-30.0, 30.0):
        module.raw_r1[...] = jnp.full(64, raw)
        module.raw_r2[...] = jnp.full(64, raw)
        assert (module.r1 > 0).all() and (module.r2 > 0).all()
        if variant == "power":
            assert (module.r2 <= 2.0).all()


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_r2_init_scale_multiplies_the_reference_draw(variant):
    """kerple_r2_init_scale s: r2 starts at s times the reference draw, r1 at the same draw."""
    config = GPTConfig(**{**TINY, "d_model": 64, "num_heads": 64}, position="kerple", kerple_variant=variant)
    reference = KerpleBias(config, rngs=nnx.Rngs(0))
    scaled = KerpleBias(config.replace(kerple_r2_init_scale=0.125), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(scaled.r2, 0.125 * reference.r2, rtol=1e-5)
    np.testing.assert_array_equal(scaled.r1, reference.r1)
    with pytest.raises(ValueError, match="kerple_r2_init_scale"):
        config.replace(kerple_r2_init_scale=0.0)
    if variant == "power":  # r2 = 2 sigmoid(raw) cannot start above 2
        with pytest.raises(ValueError, match="kerple_r2_init_scale"):
            config.replace(kerple_r2_init_scale=1.5)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_clamped_parameters_start_equal_and_pass_their_gradient_through(variant):
    """kerple_positive="clamp" (the reference code): r1, r2 are the parameters, clamped to >= 0.01
    (power r2 to <= 2) in value; the same draws as softplus start the same r1, r2; the gradient
    reaches a parameter below the clamp, as the reference's in-place clamp lets it."""
    config = GPTConfig(**TINY, position="kerple", kerple_variant=variant)
    soft = KerpleBias(config, rngs=nnx.Rngs(0))
    clamped = KerpleBias(config.replace(kerple_positive="clamp"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(clamped.r1, soft.r1, rtol=1e-5)
    np.testing.assert_allclose(clamped.r2, soft.r2, rtol=1e-5)
    np.testing.assert_array_equal(clamped.raw_r2[...], clamped.r2)
    clamped.raw_r1[...] = jnp.asarray([-3.0, 0.5])
    clamped.raw_r2[...] = jnp.asarray([-3.0, 5.0])
    np.testing.assert_array_equal(clamped.r1, np.float32([0.01, 0.5]))
    np.testing.assert_array_equal(clamped.r2, np.float32([0.01, 5.0 if variant == "log" else 2.0]))
    positions = jnp.arange(5)
    grads = nnx.grad(lambda m: jnp.sum(m(positions, positions)))(clamped)
    assert (np.asarray(grads.raw_r1[...]) != 0).all() and (np.asarray(grads.raw_r2[...]) != 0).all()
    with pytest.raises(ValueError, match="kerple_positive"):
        config.replace(kerple_positive="abs")


@pytest.mark.parametrize("variant", ["log", "power"])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_kerple_r2_held_fixed_is_what_r2_learned_starts_from_in_the_clamped_form(variant, scale):
    """Clamped, r2 held fixed is the learned form's r2 at its start, bit for bit: kept >= 0.01 even
    where kerple_r2_init_scale puts the draw below the floor."""
    config = GPTConfig(**{**TINY, "d_model": 64, "num_heads": 64}, position="kerple", kerple_variant=variant,
                       kerple_positive="clamp", kerple_r2_init_scale=scale)
    learned = KerpleBias(config, rngs=nnx.Rngs(0))
    fixed = KerpleBias(config.replace(kerple_learn_r2=False), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(fixed.r2, learned.r2)
    assert np.asarray(fixed.r2).min() >= 0.01
    if scale < 1:
        assert (np.asarray(fixed.raw_r2[...]) < 0.01).any()  # the floor is exercised


def test_fire_initialisation_follows_the_reference_code():
    module = FireBias(GPTConfig(**TINY, position="fire"), rngs=nnx.Rngs(0))
    assert module.w1.shape == (1, 32) and module.w2.shape == (32, 2) and module.b2.shape == (2,)
    assert float(module.c[...]) == pytest.approx(0.1) and float(module.threshold_multiplier[...]) == 1.0
    assert module.init_threshold == 512.0
    assert np.abs(np.asarray(module.w2[...])).max() <= 32 ** -0.5


def test_fire_threshold_can_be_fixed():
    """fire_learn_threshold=False: L is fire_threshold, a constant, not a parameter that training moves."""
    config = GPTConfig(**TINY, position="fire", fire_threshold=3.0, fire_learn_threshold=False)
    module = FireBias(config, rngs=nnx.Rngs(0))
    learned = FireBias(GPTConfig(**TINY, position="fire", fire_threshold=3.0), rngs=nnx.Rngs(0))
    names = {str(path[-1]) for path, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))}
    assert "threshold_multiplier" not in names and float(module.threshold) == 3.0
    positions = jnp.arange(7)
    np.testing.assert_array_equal(module(positions, positions), learned(positions, positions))
    grads = nnx.grad(lambda m: jnp.sum(m(positions, positions) ** 2))(module)
    assert "threshold_multiplier" not in {str(p[-1]) for p, _ in nnx.to_flat_state(grads)}


@JIT
def test_fire_scale_can_be_fixed(jit):
    """fire_learn_c=False: c is fire_c, a constant that training cannot move, and the bias is the
    learned module's at the same c; fire_c sets c's initial value either way."""
    fixed = FireBias(GPTConfig(**TINY, position="fire", fire_c=0.3, fire_learn_c=False), rngs=nnx.Rngs(0))
    learned = FireBias(GPTConfig(**TINY, position="fire", fire_c=0.3), rngs=nnx.Rngs(0))
    names = {str(path[-1]) for path, _ in nnx.to_flat_state(nnx.state(fixed, nnx.Param))}
    assert "c" not in names and "c" in {str(p[-1]) for p, _ in nnx.to_flat_state(nnx.state(learned, nnx.Param))}
    assert float(fixed.scale) == float(learned.scale) == pytest.approx(0.3)
    positions = jnp.arange(7)
    np.testing.assert_array_equal(call(fixed, jit, positions, positions), call(learned, jit, positions, positions))
    grads = nnx.grad(lambda m: jnp.sum(m(positions, positions) ** 2))(fixed)
    assert "c" not in {str(p[-1]) for p, _ in nnx.to_flat_state(grads)}
    with pytest.raises(ValueError, match="fire_c"):
        GPTConfig(**TINY, position="fire", fire_c=0.0)


@JIT
@pytest.mark.parametrize("position", ["fire", "kerple"])
def test_encoder_bias_is_symmetric(position, jit):
    model = Bert(BertConfig(**TINY, position=position), rngs=nnx.Rngs(0))
    positions = jnp.arange(9)
    bias = call(lambda p: model.encoder.positions.attention_bias(p, p), jit, positions)
    assert bias.shape == (1, 2, 9, 9)
    np.testing.assert_allclose(bias, jnp.swapaxes(bias, -1, -2), rtol=1e-6)
    assert not np.allclose(bias[0, :, 0, 1], bias[0, :, 0, 5])  # and it does depend on distance


@JIT
@pytest.mark.parametrize("position", ["fire", "kerple"])
def test_gpt_is_causal_and_finite_with_a_fully_masked_row(position, jit):
    """A future token never changes earlier logits; a first token that is padding leaves
    query 0 with no key at all, and its row (and the gradient) stays finite."""
    model = GPT(GPTConfig(**TINY, position=position, pad_id=0), rngs=nnx.Rngs(0))
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)

    def logits(state, tokens):
        return nnx.merge(graphdef, state, rest)(tokens)

    tokens = jnp.array([[0, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6]])
    changed = tokens.at[:, 4].set(9)
    out, out_changed = call(logits, jit, state, tokens), call(logits, jit, state, changed)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[:, :4], out_changed[:, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out[:, 4:], out_changed[:, 4:])
    grads = call(jax.grad(lambda s, t: logits(s, t).sum()), jit, state, tokens)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))



# directional_bias: a key after the query (j > i) gives FIRE's f the input -x, so with the MLP above
# h = relu([-x, 0.5 + x]) = (0, 0.5 + x) and the heads are (0.1, 2 (0.5 + x) - 0.2) = (0.1, 0.8 + 2x).
FIRE_DIRECTIONAL_EXPECTED = {
    (1, 3): (0.1, 2.384963),     # x = log 3 / log 4 = 0.792481
    (1, 12): (0.1, 2.737587),    # x = log 12 / log 13 = 0.968794
    (3, 12): (0.1, 2.595423),    # x = log 10 / log 13 = 0.897712
    (7, 12): (0.1, 2.197111),    # x = log 6 / log 13 = 0.698555
}


@JIT
def test_directional_fire_bias_matches_the_formula(jit):
    """Keys at or before the query keep the paper's bias; keys after it get f(-x)."""
    bias = call(lambda q, k: ops.fire_bias(q, k, FIRE_W1, FIRE_B1, FIRE_W2, FIRE_B2, 1.0, 3.0,
                                             directional=True),
                jit, FIRE_Q, FIRE_K)
    q, k = list(map(int, FIRE_Q)), list(map(int, FIRE_K))
    for (i, j), expected in {**FIRE_EXPECTED, **FIRE_DIRECTIONAL_EXPECTED}.items():
        np.testing.assert_allclose(bias[0, :, q.index(i), k.index(j)], expected, atol=1e-5)


@JIT
@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_per_direction_uses_row_0_before_and_row_1_after_the_query(variant, jit):
    r1_2N, r2_2N = jnp.array([[1.0, 0.5], [0.3, 1.5]]), jnp.array([[0.5, 1.0], [1.5, 0.2]])
    q_BT, k_BS = jnp.array([[4, 5, 9], [0, 2, 3]]), jnp.array([[0, 4, 7, 9, 12], [1, 2, 3, 6, 8]])
    bias = call(lambda q, k: ops.kerple_bias(q, k, r1_2N, r2_2N, variant), jit, q_BT, k_BS)
    before, after = (ops.kerple_bias(q_BT, k_BS, r1_2N[d], r2_2N[d], variant) for d in (0, 1))
    after_B1TS = (k_BS[:, None, :] > q_BT[:, :, None])[:, None]
    assert after_B1TS.any() and (~after_B1TS).any()
    np.testing.assert_allclose(bias, jnp.where(after_B1TS, after, before), rtol=1e-6)


def test_kerple_per_direction_parameters_follow_the_reference_init():
    config = BertConfig(**{**TINY, "d_model": 64, "num_heads": 64}, position="kerple", directional_bias=True)
    module = KerpleBias(config, directional=True, rngs=nnx.Rngs(0))
    assert module.raw_r1.shape == module.raw_r2.shape == (2, 64)
    assert (module.r1 > 0).all() and (module.r1 < 2.0).all() and (module.r2 > 0).all() and (module.r2 < 1.0).all()
    assert not np.allclose(module.r1[0], module.r1[1])  # each direction its own draw


@JIT
def test_directional_alibi_follows_ruoss_et_al(jit):
    """Their encoder's ALiBi: -slope * |i - j|, plus slope / 2 on keys before the query."""
    q, k = jnp.array([2, 5]), jnp.array([0, 2, 3, 9])
    bias = call(lambda q, k: ops.alibi_bias(2, q, k, directional=True), jit, q, k)
    slopes = np.asarray(ops.alibi_slopes(2))
    for t, i in enumerate([2, 5]):
        for s, j in enumerate([0, 2, 3, 9]):
            expected = -slopes * abs(i - j) + (slopes / 2 if j < i else 0.0)
            np.testing.assert_allclose(bias[0, :, t, s], expected, rtol=1e-6)


def test_t5_takes_direction_in_its_encoder_only():
    """The decoder's self-attention is causal: no key after the query, nothing to tell apart."""
    for position in ("alibi", "fire", "kerple"):
        model = T5(T5Config(**TINY, position=position, directional_bias=True), rngs=nnx.Rngs(0))
        assert model.encoder.positions.directional and not model.decoder.positions.directional
    model = T5(T5Config(**TINY, position="kerple", directional_bias=True), rngs=nnx.Rngs(0))
    assert model.encoder.positions.relative.raw_r1.shape == (2, 2)
    assert model.decoder.positions.relative.raw_r1.shape == (2,)


@JIT
@pytest.mark.parametrize("position", ["fire", "kerple", "alibi", "fire+directional", "kerple+directional",
                                      "alibi+directional"])
def test_an_encoder_tells_left_from_right_only_with_directional_bias(position, jit):
    """A distance bias |i - j| (and FIRE's normaliser, constant while L = 512 exceeds every position)
    is unchanged by mirroring the row, so the symmetric encoder's logits on a reversed input are its
    logits reversed; directional_bias breaks that symmetry. Values and outputs are scaled up so
    that attention, not the token embedding, dominates the logits (of size ~0.2)."""
    kind, directional = position.removesuffix("+directional"), position.endswith("+directional")
    model = Bert(BertConfig(**TINY, position=kind, directional_bias=directional), rngs=nnx.Rngs(0))
    for block in model.encoder.blocks:
        for projection in (block.self_attn.v, block.self_attn.o):
            projection.kernel[...] = 30 * projection.kernel[...]
    graphdef, state = nnx.split(model)

    def logits(state, tokens):
        return nnx.merge(graphdef, state)(tokens)

    tokens = jnp.array([[3, 4, 5, 6, 7, 8, 9], [1, 1, 2, 9, 5, 5, 6]])
    out, mirrored = call(logits, jit, state, tokens), call(logits, jit, state, tokens[:, ::-1])
    if directional:
        assert np.abs(mirrored[:, ::-1] - out).max() > 1e-4  # 1e-3 (ALiBi), 8e-3 (FIRE), 5e-2 (KERPLE) here
    else:
        np.testing.assert_allclose(mirrored[:, ::-1], out, rtol=0, atol=1e-6)  # <= 1e-7 here


def test_directional_bias_is_refused_where_it_would_do_nothing():
    with pytest.raises(ValueError, match="directional_bias"):
        BertConfig(**TINY, position="rope", directional_bias=True)
    with pytest.raises(ValueError, match="directional_bias"):
        GPTConfig(**TINY, position="fire", directional_bias=True)  # causal: no key after the query
