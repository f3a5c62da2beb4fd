"""Rotary positions: xPos against the paper's formula, RoPE scalings (linear, NTK, YaRN), config checks."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import GPT, BertConfig, GPTConfig, T5Config, ops
from txjax.config import positions_for

jax.config.update("jax_numpy_rank_promotion", "raise")

TINY = dict(vocab_size=13, max_len=12, d_model=16, num_heads=2, num_layers=2, d_ff=32)


def random(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


# ---------------------------------------------------------------- xPos


def test_xpos_zeta_is_the_papers():
    """zeta_i = (2i/H + 0.4) / 1.4: H = 4 gives 0.4/1.4 = 2/7 and (0.5 + 0.4)/1.4 = 9/14."""
    np.testing.assert_allclose(ops.positions.xpos_zeta(4), [2 / 7, 9 / 14], rtol=1e-6)


@pytest.mark.parametrize("downscale", [False, True])
def test_xpos_at_a_hand_computed_point(downscale):
    """H = 4, base 10^4, gamma = 2, x = (1, 2, 3, 4) at n = 3: the pairs (x0, x2) and (x1, x3)
    turn by n * theta_i (theta = 1, 10^-2) and are scaled by zeta_i^(+-n / gamma)."""
    x = jnp.asarray([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    n, gamma, sign = 3, 2.0, -1.0 if downscale else 1.0
    zeta, theta = (2 / 7, 9 / 14), (1.0, 0.01)
    want = [0.0] * 4
    for i, (a, b) in enumerate([(1.0, 3.0), (2.0, 4.0)]):
        angle, scale = n * theta[i], zeta[i] ** (sign * n / gamma)
        want[i] = (a * math.cos(angle) - b * math.sin(angle)) * scale
        want[i + 2] = (b * math.cos(angle) + a * math.sin(angle)) * scale
    got = ops.apply_xpos(x, jnp.asarray([n]), scale_base=gamma, downscale=downscale)
    np.testing.assert_allclose(got.reshape(4), want, rtol=1e-5, atol=1e-6)
    if not downscale:  # (2/7)^1.5 and (9/14)^1.5, written out
        np.testing.assert_allclose(np.asarray(want) / [
            math.cos(3) - 3 * math.sin(3), 2 * math.cos(0.03) - 4 * math.sin(0.03),
            3 * math.cos(3) + math.sin(3), 4 * math.cos(0.03) + 2 * math.sin(0.03)],
            [0.152721, 0.515437, 0.152721, 0.515437], rtol=1e-5)


def test_xpos_query_key_product_depends_on_the_offset_times_the_decay():
    """q(n) . k(m) = sum_i zeta_i^((n-m)/gamma) [(ac + bd) cos(phi_i) + (bc - ad) sin(phi_i)],
    phi_i = (m - n) theta_i, for the pair i of q = (a, b) and k = (c, d): a function of n - m."""
    h, gamma, base = 8, 16.0, 10000.0
    q, k = random(0, (1, 1, 1, h)), random(1, (1, 1, 1, h))

    def product(n, m):
        qn = ops.apply_xpos(q, jnp.asarray([n]), base, gamma)
        km = ops.apply_xpos(k, jnp.asarray([m]), base, gamma, downscale=True)
        return float(jnp.sum(qn * km))

    qv, kv = np.asarray(q).reshape(h), np.asarray(k).reshape(h)
    for n, m in [(5, 2), (9, 0), (40, 37), (3, 3)]:
        want = 0.0
        for i in range(h // 2):
            a, b, c, d = qv[i], qv[i + h // 2], kv[i], kv[i + h // 2]
            zeta, phi = (2 * i / h + 0.4) / 1.4, (m - n) * base ** (-2 * i / h)
            want += zeta ** ((n - m) / gamma) * ((a * c + b * d) * math.cos(phi) + (b * c - a * d) * math.sin(phi))
        np.testing.assert_allclose(product(n, m), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(product(40, 37), product(5, 2), rtol=1e-4)


def test_xpos_per_row_positions_equal_row_by_row():
    x = random(2, (2, 5, 3, 8))
    pos_BT = jnp.asarray([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    got = ops.apply_xpos(x, pos_BT, downscale=True, scaling="yarn", factor=2.0, original_max_len=8)
    for b in range(2):
        want = ops.apply_xpos(x[b:b + 1], pos_BT[b], downscale=True, scaling="yarn", factor=2.0, original_max_len=8)
        np.testing.assert_allclose(got[b:b + 1], want, rtol=1e-6)


# ---------------------------------------------------------------- RoPE scalings


class ScaledRopeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_linear_interpolation_at_p_is_plain_rope_at_p_over_s(self):
        x, p = random(3, (2, 6, 2, 8)), jnp.arange(6) * 5
        linear = self.variant(functools.partial(ops.apply_rope, scaling="linear", factor=4.0))
        np.testing.assert_allclose(linear(x, p), self.variant(ops.apply_rope)(x, p / 4.0), rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_factor_one_is_plain_rope_bit_for_bit(self):
        x, p = random(4, (2, 6, 2, 8)), jnp.arange(6) * 7
        plain = self.variant(ops.apply_rope)(x, p)
        for scaling in ops.ROPE_SCALINGS:
            scaled = self.variant(functools.partial(ops.apply_rope, scaling=scaling, factor=1.0, original_max_len=4))
            np.testing.assert_array_equal(scaled(x, p), plain)

    @chex.variants(with_jit=True, without_jit=True)
    def test_xpos_jit_and_eager_agree(self):
        x, p = random(5, (1, 4, 2, 8)), jnp.arange(4)
        xpos = functools.partial(ops.apply_xpos, scale_base=8.0, scaling="ntk", factor=2.0)
        np.testing.assert_allclose(self.variant(xpos)(x, p), xpos(x, p), rtol=1e-6)


def test_ntk_base_at_a_hand_value():
    """H = 4, s = 4: base 10^4 * 4^(4/2) = 160000, so theta_1 = 160000^(-1/2) = 1/400."""
    np.testing.assert_allclose(ops.rope_inv_freq(4, 10000.0, "ntk", 4.0), [1.0, 0.0025], rtol=1e-6)


def test_yarn_frequencies_ramp_between_beta_fast_and_beta_slow():
    """H = 64, base 10^4, original context 2048, s = 4. The pair turning r times over the context is
    64 ln(2048 / (2 pi r)) / (2 ln 10^4): 8.06 for beta_fast = 32 (floor: 8), 20.1 for beta_slow = 1
    (ceil: 21). Pairs up to 8 keep theta_i, pairs from 21 take theta_i / 4, and pair 13, at
    (13 - 8) / (21 - 8) = 5/13 of the ramp, theta_13 * (1 - 5/13 + (5/13) / 4)."""
    theta = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    got = np.asarray(ops.rope_inv_freq(64, 10000.0, "yarn", 4.0, 2048))
    np.testing.assert_allclose(got[:9], theta[:9], rtol=1e-5)
    np.testing.assert_allclose(got[21:], theta[21:] / 4, rtol=1e-5)
    np.testing.assert_allclose(got[13], theta[13] * (1 - 5 / 13 + 5 / 13 / 4), rtol=1e-5)
    assert np.all(np.diff(got / theta) <= 1e-7)  # a monotone ramp from 1 down to 1/4


def test_yarn_temperature():
    """sqrt(1/t) = 0.1 ln(s) + 1 multiplies q and k: s = e gives 1.1, s = 2 gives 1.0693147; s = 1 none."""
    assert ops.rope_attention_factor("yarn", math.e) == pytest.approx(1.1)
    assert ops.rope_attention_factor("yarn", 2.0) == pytest.approx(1.0693147, rel=1e-7)
    assert ops.rope_attention_factor("yarn", 1.0) == 1.0
    assert ops.rope_attention_factor("ntk", 2.0) == 1.0
    x = random(6, (1, 3, 2, 8))
    norms = jnp.linalg.norm(ops.apply_rope(x, jnp.arange(3), scaling="yarn", factor=math.e, original_max_len=4), axis=-1)
    np.testing.assert_allclose(norms, 1.1 * jnp.linalg.norm(x, axis=-1), rtol=1e-5)


def test_unknown_scaling_and_missing_original_context_are_refused():
    with pytest.raises(ValueError, match="not one of"):
        ops.rope_inv_freq(8, scaling="dynamic", factor=2.0)
    with pytest.raises(ValueError, match="original_max_len"):
        ops.rope_inv_freq(8, scaling="yarn", factor=2.0)


@pytest.mark.parametrize("scaling", ["ntk", "yarn"])
def test_gpt_with_factor_one_is_plain_rope_bit_for_bit(scaling):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 13, (2, 9)), jnp.int32)
    plain = GPT(GPTConfig(**TINY, position="rope"), rngs=nnx.Rngs(0))(tokens)
    scaled = GPT(GPTConfig(**TINY, position="rope", rope_scaling=scaling), rngs=nnx.Rngs(0))(tokens)
    np.testing.assert_array_equal(scaled, plain)


# ---------------------------------------------------------------- config


def test_bidirectional_families_refuse_xpos():
    with pytest.raises(ValueError, match="causal attention only"):
        BertConfig(position="xpos")
    with pytest.raises(ValueError, match="causal attention only"):
        T5Config(position="xpos")
    assert GPTConfig(position="xpos").position == "xpos"
    assert "xpos" in positions_for("gpt") and "xpos" not in positions_for("bert") + positions_for("t5")


def test_bad_scaling_configs_are_refused():
    with pytest.raises(ValueError, match="rope_scaling='dynamic' is not one of"):
        GPTConfig(position="rope", rope_scaling="dynamic")
    with pytest.raises(ValueError, match="needs a rotary position"):
        GPTConfig(position="alibi", rope_scaling="linear")
    with pytest.raises(ValueError, match="rope_scaling_factor must be >= 1"):
        GPTConfig(position="rope", rope_scaling="linear", rope_scaling_factor=0.5)
    with pytest.raises(ValueError, match="even head width"):
        GPTConfig(position="xpos", d_model=6, num_heads=2)
