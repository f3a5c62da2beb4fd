"""Models: every family x position encoding x norm position; causality, padding, counts, bad input."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config
from txjax.config import positions_for

TINY = dict(vocab_size=23, max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=32)
FAMILIES = {"gpt": (GPT, GPTConfig), "bert": (Bert, BertConfig), "t5": (T5, T5Config)}


def make(family, **changes):
    cls, cfg_cls = FAMILIES[family]
    return cls(cfg_cls(**{**TINY, **changes}), rngs=nnx.Rngs(0))


def run(model, tokens_BT, dec_BT=None):
    if isinstance(model, T5):
        return model(tokens_BT, tokens_BT if dec_BT is None else dec_BT)
    return model(tokens_BT)


def random_tokens(seed, shape, low=1, high=TINY["vocab_size"]):
    return jnp.asarray(np.random.default_rng(seed).integers(low, high, size=shape), jnp.int32)


FAMILY_POSITIONS = [(family, position) for family in FAMILIES for position in positions_for(family)]


@pytest.mark.parametrize("family,position", FAMILY_POSITIONS)
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_forward_shape_and_finite_jit_and_eager(family, position, norm_position):
    model = make(family, position=position, norm_position=norm_position)
    tokens = random_tokens(0, (2, 7))
    graphdef, state = nnx.split(model)
    jitted = jax.jit(lambda s, t: run(nnx.merge(graphdef, s), t))(state, tokens)
    chex.assert_shape(jitted, (2, 7, TINY["vocab_size"]))
    chex.assert_tree_all_finite(jitted)
    if norm_position == "pre":  # eager dispatch is slow on 2 cores: once per family x position
        np.testing.assert_allclose(run(model, tokens), jitted, atol=1e-5)


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("activation,gated", [("gelu", False), ("gelu_tanh", True), ("relu", False), ("silu", True)])
def test_norm_and_activation_variants(norm, activation, gated):
    model = make("gpt", norm=norm, activation=activation, gated=gated, tie_embeddings=False)
    chex.assert_tree_all_finite(model(random_tokens(1, (1, 5))))


@pytest.mark.parametrize("family,init", [("gpt", None), ("bert", None), ("t5", None), ("gpt", "t5"), ("t5", "normal")])
def test_init_scales(family, init):
    """"normal": every embedding and kernel entry has std 0.02; "t5" (T5's default): embeddings
    std 1, each dense kernel std 1/sqrt(fan_in), as t5x initialises them."""
    changes = dict(vocab_size=400, d_model=64, num_heads=4, d_ff=256, tie_embeddings=False)
    model = make(family, **changes, **({} if init is None else {"init": init}))
    t5 = model.config.init == "t5"
    assert t5 == (family == "t5" if init is None else init == "t5")
    np.testing.assert_allclose(np.std(model.embed.embedding[...]), 1.0 if t5 else 0.02, rtol=0.05)
    block = {"gpt": lambda: model.decoder, "bert": lambda: model.encoder, "t5": lambda: model.decoder}[family]().blocks[0]
    for dense in (block.ffn.wi, block.ffn.wo, block.self_attn.q, block.self_attn.o):
        kernel = np.asarray(dense.kernel[...])
        np.testing.assert_allclose(kernel.std(), kernel.shape[0] ** -0.5 if t5 else 0.02, rtol=0.05)


def future_changed(tokens, i, seed):
    """A copy of tokens whose positions after i are resampled."""
    other = random_tokens(seed, tokens.shape)
    return tokens.at[:, i + 1:].set(other[:, i + 1:])


@pytest.mark.parametrize("position", positions_for("gpt"))
def test_gpt_is_causal(position):
    model = make("gpt", position=position)
    tokens = random_tokens(2, (2, 12))
    base = model(tokens)
    for i in (0, 4, 10):
        changed = model(future_changed(tokens, i, seed=10 + i))
        np.testing.assert_allclose(changed[:, : i + 1], base[:, : i + 1], atol=1e-6)
        assert not np.allclose(changed[:, i + 1:], base[:, i + 1:], atol=1e-6)


@pytest.mark.parametrize("position", positions_for("gpt"))
def test_gpt_causality_through_gradients(position):
    """d logits[:, i] / d embedding of token j is zero for every j > i (nanodo's test_causality)."""
    model = make("gpt", position=position)
    tokens = random_tokens(3, (1, 8))
    graphdef, state = nnx.split(model)
    i = 3

    def out_i(x_BTD):
        m = nnx.merge(graphdef, state)
        positions = jnp.arange(8)
        h, _ = m.decoder(m.decoder.embed_positions(x_BTD, positions), positions, valid_BT=m.valid(tokens))
        return jnp.sum(m.logits(h)[:, i])

    grad_BTD = jax.grad(out_i)(model.embed(tokens))
    np.testing.assert_array_equal(grad_BTD[:, i + 1:], 0.0)
    assert np.abs(grad_BTD[:, : i + 1]).sum() > 0


@pytest.mark.parametrize("position", positions_for("t5"))
def test_t5_decoder_is_causal(position):
    model = make("t5", position=position)
    enc = random_tokens(4, (2, 9))
    dec = random_tokens(5, (2, 10))
    base = model(enc, dec)
    for i in (0, 5):
        changed = model(enc, future_changed(dec, i, seed=20 + i))
        np.testing.assert_allclose(changed[:, : i + 1], base[:, : i + 1], atol=1e-6)


def test_t5_decoder_sees_the_whole_encoder_input():
    model = make("t5")
    enc = random_tokens(6, (1, 9))
    dec = random_tokens(7, (1, 4))
    changed = model(enc.at[:, -1].set((enc[0, -1] % 20) + 1), dec)
    assert not np.allclose(changed[:, 0], model(enc, dec)[:, 0], atol=1e-6)


@pytest.mark.parametrize("position", positions_for("bert"))
def test_bert_is_permutation_equivariant_exactly_without_positions(position):
    """Permuting the tokens permutes the outputs iff nothing encodes position: every
    encoding (absolute, rotary or relative bias) must break the symmetry."""
    model = make("bert", position=position, pad_id=None)
    # Parameters x 4, as after training: at init (std 0.02) position effects sit near rounding.
    nnx.update(model, jax.tree.map(lambda p: 4.0 * p, nnx.state(model, nnx.Param)))
    tokens = random_tokens(8, (2, 10))
    perm = np.random.default_rng(0).permutation(10)
    permuted, original = model(tokens[:, perm]), model(tokens)[:, perm]
    if position == "none":
        np.testing.assert_allclose(permuted, original, atol=1e-4)
    else:
        assert float(jnp.max(jnp.abs(permuted - original))) > 1e-2


@pytest.mark.parametrize("position", positions_for("bert"))
def test_bert_real_tokens_ignore_the_padded_tail(position):
    """Tail length and the content at padded positions (segment ids) change nothing real."""
    model = make("bert", position=position)
    real = random_tokens(9, (1, 6))
    pad = lambda n: jnp.concatenate([real, jnp.zeros((1, n), jnp.int32)], axis=1)  # noqa: E731
    short = model(pad(2))[:, :6]
    long = model(pad(9))[:, :6]
    segments = jnp.concatenate([jnp.zeros((1, 6), jnp.int32), jnp.ones((1, 9), jnp.int32)], axis=1)
    other_content = model(pad(9), segments)[:, :6]
    np.testing.assert_allclose(long, short, atol=1e-5)
    np.testing.assert_allclose(other_content, short, atol=1e-5)


def test_t5_encoder_padding_does_not_reach_the_decoder():
    model = make("t5")
    real = random_tokens(11, (1, 5))
    dec = random_tokens(12, (1, 4))
    a = model(jnp.concatenate([real, jnp.zeros((1, 2), jnp.int32)], axis=1), dec)
    b = model(jnp.concatenate([real, jnp.zeros((1, 7), jnp.int32)], axis=1), dec)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_dropout_is_active_in_train_mode_only():
    model = make("gpt", dropout=0.5)
    tokens = random_tokens(13, (1, 6))
    model.train()
    assert not np.allclose(model(tokens), model(tokens))
    model.eval()
    np.testing.assert_array_equal(model(tokens), model(tokens))


# ---------------------------------------------------------------- parameter counts


def n_params(model_or_fn):
    model = nnx.eval_shape(model_or_fn) if callable(model_or_fn) and not isinstance(model_or_fn, nnx.Module) else model_or_fn
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def closed_form(family, cfg):
    """Parameters from the formulas: attention 4 D^2 (+ 4 D biases), FFN 2 D F (+ F + D)."""
    d, f, v, L = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    norm = 2 * d if cfg.norm == "layer" else d
    attn = 4 * d * d + (4 * d if cfg.use_bias else 0)
    ffn = (3 if cfg.gated else 2) * d * f + ((2 if cfg.gated else 1) * f + d if cfg.use_bias else 0)
    block = attn + ffn + 2 * norm
    w, n = cfg.fire_mlp_width, cfg.num_heads
    positions = {
        "learned": cfg.max_len * d,
        "t5": cfg.num_buckets * n,
        "fire": (1 * w + w) + (w * n + n) + 2,  # MLP 1 -> W -> N, c, threshold multiplier
        "kerple": 2 * n,  # r1, r2 per head
    }.get(cfg.position, 0)
    final = norm if cfg.norm_position == "pre" else 0
    head = 0 if cfg.tie_embeddings else d * v
    if family == "gpt":
        return v * d + positions + L * block + final + head
    if family == "bert":
        mlm = d * d + d + norm + v
        return v * d + cfg.type_vocab_size * d + positions + norm + L * block + final + mlm
    dec_block = block + attn + norm
    return v * d + 2 * positions + L * block + L * dec_block + 2 * final + head


@pytest.mark.parametrize("family,position", FAMILY_POSITIONS)
@pytest.mark.parametrize(
    "changes",
    [{}, dict(use_bias=False, norm="rms"), dict(gated=True, tie_embeddings=False, norm_position="post")],
)
def test_parameter_count_equals_closed_form(family, position, changes):
    if family == "bert" and "tie_embeddings" in changes:
        changes = {k: v for k, v in changes.items() if k != "tie_embeddings"}
    cls, cfg_cls = FAMILIES[family]
    cfg = cfg_cls(**{**TINY, "position": position, **changes})
    assert n_params(lambda: cls(cfg, rngs=nnx.Rngs(0))) == closed_form(family, cfg)


def test_attention_without_biases_is_4_d_squared():
    from txjax.nn import MultiHeadAttention

    cfg = GPTConfig(**{**TINY, "d_model": 24, "num_heads": 3, "use_bias": False})
    assert n_params(MultiHeadAttention(cfg, rngs=nnx.Rngs(0))) == 4 * 24 * 24


def test_full_size_counts_against_published_figures():
    """eval_shape only: no memory is allocated for the full-size weights.

    GPT-2 small: 124,439,808 exactly (the "124M"; lm_head is tied, so not counted twice).
    BERT-base: the published "110M" is BertModel with its pooler: 109,482,240. We build
    BertForMaskedLM, which has no pooler (-590,592 = 768*768 + 768) and an MLM head
    (+622,650 = dense 768*768 + 768, LayerNorm 2*768, output bias 30,522; decoder tied).
    t5-small: "60M" is 60,506,624 exactly: shared embedding 32128*512 = 16,449,536,
    6 encoder blocks of 3,146,752 (+ final norm 512 + relative table 32*8), 6 decoder
    blocks of 4,195,840 (+ 512 + 256), no biases, tied head.
    """
    gpt = n_params(lambda: GPT(GPTConfig.gpt2_small(), rngs=nnx.Rngs(0)))
    bert = n_params(lambda: Bert(BertConfig.bert_base(), rngs=nnx.Rngs(0)))
    t5 = n_params(lambda: T5(T5Config.t5_small(), rngs=nnx.Rngs(0)))
    assert gpt == 124_439_808
    assert bert == 109_482_240 - (768 * 768 + 768) + (768 * 768 + 768 + 2 * 768 + 30522) == 109_514_298
    assert t5 == 32128 * 512 + 6 * 3_146_752 + 512 + 256 + 6 * 4_195_840 + 512 + 256 == 60_506_624


# ---------------------------------------------------------------- bad input


def test_unknown_position_and_bad_config_values():
    with pytest.raises(ValueError, match="position='rotary' is not one of"):
        GPTConfig(position="rotary")
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig(d_model=10, num_heads=3)
    with pytest.raises(ValueError, match="positive int"):
        GPTConfig(num_layers=0)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_sequence_beyond_learned_table_is_an_error(family):
    model = make(family, position="learned")
    with pytest.raises(ValueError, match="exceeds max_len=16"):
        run(model, random_tokens(0, (1, 17)))


@pytest.mark.parametrize("family", FAMILIES)
def test_other_positions_run_beyond_max_len(family):
    model = make(family, position="rope")
    chex.assert_tree_all_finite(run(model, random_tokens(0, (1, 20))))


@pytest.mark.parametrize("family", FAMILIES)
def test_token_ids_outside_vocabulary(family):
    model = make(family)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 23\)"):
        run(model, jnp.array([[1, 2, 23]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(model, jnp.array([[1, -1, 2]]))


def test_out_of_vocabulary_under_jit_is_nan_not_a_clamped_row():
    model = make("gpt")
    graphdef, state = nnx.split(model)
    good = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.array([[1, 2, 3]]))
    bad = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.array([[1, 2, 99]]))
    chex.assert_tree_all_finite(good)
    # The bad id's row is NaN; attention then spreads it (0 * NaN), so the loss is NaN too.
    assert np.all(np.isnan(bad[:, 2]))


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_rank_and_dtype(family):
    model = make(family)
    with pytest.raises(ValueError, match=r"must be \[B, T\]"):
        run(model, jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="integer ids"):
        run(model, jnp.ones((1, 3)))


def test_wrong_width_into_a_module():
    from txjax.nn import FeedForward, MultiHeadAttention

    cfg = GPTConfig(**TINY)
    with pytest.raises(ValueError, match=r"expects \[B, T, 16\]"):
        MultiHeadAttention(cfg, rngs=nnx.Rngs(0))(jnp.ones((1, 3, 8)))
    with pytest.raises(ValueError, match=r"expects \[B, T, 16\]"):
        FeedForward(cfg, rngs=nnx.Rngs(0))(jnp.ones((1, 3, 8)))


def test_bert_segment_ids_checked():
    model = make("bert")
    with pytest.raises(ValueError, match="segment_ids"):
        model(jnp.ones((1, 4), jnp.int32), jnp.full((1, 4), 2, jnp.int32))
    with pytest.raises(ValueError, match="shape of tokens"):
        model(jnp.ones((1, 4), jnp.int32), jnp.zeros((1, 3), jnp.int32))


def test_constant_tokens_captured_inside_jit_are_still_checked():
    model = make("gpt")
    graphdef, state = nnx.split(model)
    good, bad = jnp.array([[1, 2, 3]]), jnp.array([[1, 2, 99]])
    chex.assert_tree_all_finite(jax.jit(lambda s: nnx.merge(graphdef, s)(good))(state))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        jax.jit(lambda s: nnx.merge(graphdef, s)(bad))(state)
