"""Pure ops: attention, masks, norms, positions, loss — against references and hand values."""

import math

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from txjax import ops


def np_attention(q, k, v, bias):
    """NumPy reference: softmax(q k^T / sqrt(H) + bias) v, per head."""
    scores = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1]) + bias
    scores = scores - scores.max(-1, keepdims=True)
    w = np.exp(scores)
    w = w / w.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", w, v), w


class AttentionTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_numpy_reference_self_and_cross(self):
        rng = np.random.default_rng(0)
        for t, s in [(5, 5), (3, 7), (7, 2)]:
            q = rng.normal(size=(2, t, 3, 4)).astype(np.float32)
            k = rng.normal(size=(2, s, 3, 4)).astype(np.float32)
            v = rng.normal(size=(2, s, 3, 4)).astype(np.float32)
            bias = rng.normal(size=(1, 3, t, s)).astype(np.float32)
            out = self.variant(ops.dot_product_attention)(q, k, v, bias)
            expected, _ = np_attention(q, k, v, bias)
            chex.assert_shape(out, (2, t, 3, 4))
            np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_masked_keys_get_exactly_zero_and_rows_sum_to_one(self):
        rng = np.random.default_rng(1)
        q = rng.normal(size=(2, 6, 2, 8)).astype(np.float32)
        k = rng.normal(size=(2, 6, 2, 8)).astype(np.float32) * 10
        tokens = np.array([[5, 6, 7, 0, 0, 0], [1, 2, 3, 4, 5, 0]])
        mask = ops.causal_mask(6) & ops.padding_mask(jnp.asarray(tokens), 0)
        w = self.variant(ops.attention_weights)(q, k, ops.mask_to_bias(mask))
        mask_b = np.broadcast_to(np.asarray(mask), w.shape)
        assert np.all(np.asarray(w)[~mask_b] == 0.0)
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_fully_masked_row_gives_zeros_and_finite_gradients(self):
        rng = np.random.default_rng(2)
        q, k, v = (jnp.asarray(rng.normal(size=(1, 3, 2, 4)), jnp.float32) for _ in range(3))
        mask = jnp.array([[True, True, False], [False, False, False], [True, False, True]])
        bias = ops.mask_to_bias(mask[None, None])

        def loss(q, k, v):
            return jnp.sum(ops.dot_product_attention(q, k, v, bias) ** 2)

        out = self.variant(ops.dot_product_attention)(q, k, v, bias)
        np.testing.assert_array_equal(out[:, 1], 0.0)
        assert np.all(np.isfinite(out))
        grads = self.variant(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        for g in grads:
            assert np.all(np.isfinite(g))
        # The dead query row receives no gradient at all.
        np.testing.assert_array_equal(grads[0][:, 1], 0.0)

    @settings(max_examples=12, deadline=None)
    @given(
        t=st.integers(1, 6), s=st.integers(1, 6), n=st.integers(1, 3), h=st.sampled_from([2, 4]),
        seed=st.integers(0, 2**16),
    )
    def test_property_random_masks(self, t, s, n, h, seed):
        """Against NumPy on random shapes, with a random mask in which every row keeps a key."""
        rng = np.random.default_rng(seed)
        q = rng.normal(size=(1, t, n, h)).astype(np.float32)
        k = rng.normal(size=(1, s, n, h)).astype(np.float32)
        v = rng.normal(size=(1, s, n, h)).astype(np.float32)
        mask = rng.random((1, 1, t, s)) < 0.6
        mask[..., 0] = True
        bias = np.asarray(ops.mask_to_bias(jnp.asarray(mask)))
        out = ops.dot_product_attention(q, k, v, bias)
        expected, w = np_attention(q, k, v, np.where(mask, 0.0, -1e30))
        np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-4)
        got_w = np.asarray(ops.attention_weights(q, k, bias))
        assert np.all(got_w[np.broadcast_to(~mask, got_w.shape)] == 0.0)

    def test_bias_is_any_sum_of_masks_and_relative_biases(self):
        t = 5
        tokens = jnp.array([[3, 4, 5, 0, 0]])
        mask = ops.causal_mask(t) & ops.padding_mask(tokens, 0)
        bias = ops.mask_to_bias(mask) + ops.alibi_bias(2, jnp.arange(t), jnp.arange(t))
        rng = np.random.default_rng(3)
        q, k, v = (rng.normal(size=(1, t, 2, 4)).astype(np.float32) for _ in range(3))
        out = ops.dot_product_attention(q, k, v, bias)
        expected, _ = np_attention(q, k, v, np.asarray(bias))
        np.testing.assert_allclose(out, expected, atol=1e-5)

    def test_bad_shapes_are_clear_errors(self):
        x = jnp.zeros((1, 3, 2, 4))
        with pytest.raises(ValueError, match="must be"):
            ops.dot_product_attention(jnp.zeros((3, 2, 4)), x, x)
        with pytest.raises(ValueError, match="head width"):
            ops.dot_product_attention(x, jnp.zeros((1, 3, 2, 5)), jnp.zeros((1, 3, 2, 5)))
        with pytest.raises(ValueError, match="one shape"):
            ops.dot_product_attention(x, x, jnp.zeros((1, 4, 2, 4)))


def test_masks_hand_values():
    np.testing.assert_array_equal(
        ops.causal_mask(3)[0, 0], [[True, False, False], [True, True, False], [True, True, True]]
    )
    # Two new queries after three cached keys.
    np.testing.assert_array_equal(
        ops.causal_mask(2, 5)[0, 0], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    )
    pad = ops.padding_mask(jnp.array([[7, 8, 0]]), pad_id=0)
    chex.assert_shape(pad, (1, 1, 1, 3))
    np.testing.assert_array_equal(pad[0, 0, 0], [True, True, False])
    bias = ops.mask_to_bias(jnp.array([True, False]))
    assert bias[0] == 0.0 and bias[1] == -jnp.inf


def test_split_merge_heads_round_trip():
    x = jnp.arange(2 * 3 * 8, dtype=jnp.float32).reshape(2, 3, 8)
    heads = ops.split_heads(x, 4)
    chex.assert_shape(heads, (2, 3, 4, 2))
    np.testing.assert_array_equal(heads[0, 0, 1], [2.0, 3.0])  # head n holds channels n*H..n*H+H-1
    np.testing.assert_array_equal(ops.merge_heads(heads), x)


def test_layer_norm_hand_values():
    x = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    # mean 2.5, biased variance 1.25
    expected = (np.array([1, 2, 3, 4]) - 2.5) / np.sqrt(1.25 + 1e-5) * 2.0 + 0.5
    np.testing.assert_allclose(ops.layer_norm(x, jnp.full(4, 2.0), jnp.full(4, 0.5))[0], expected, rtol=1e-6)


def test_rms_norm_hand_values():
    x = jnp.array([3.0, 4.0])
    np.testing.assert_allclose(ops.rms_norm(x, jnp.ones(2)), np.array([3, 4]) / np.sqrt(12.5 + 1e-6), rtol=1e-6)


def test_norm_scale_width_mismatch_is_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        ops.layer_norm(jnp.ones((2, 4)), jnp.ones(3), None)


def test_sinusoidal_hand_values():
    table = ops.sinusoidal_positions(jnp.array([0, 1, 2]), 4)
    np.testing.assert_allclose(table[0], [0, 1, 0, 1], atol=1e-7)
    np.testing.assert_allclose(table[1], [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)], rtol=1e-6)
    np.testing.assert_allclose(table[2], [np.sin(2), np.cos(2), np.sin(0.02), np.cos(0.02)], rtol=1e-6)


class RopeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_dot_product_depends_only_on_offset(self):
        rng = np.random.default_rng(4)
        q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
        k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
        rope = self.variant(ops.apply_rope)

        def score(i, j):
            return float(jnp.sum(rope(q, jnp.array([i])) * rope(k, jnp.array([j]))))

        for offset in (0, 1, 5):
            ref = score(offset, 0)
            for i in (10, 37, 200):
                np.testing.assert_allclose(score(i + offset, i), ref, rtol=1e-4, atol=1e-4)
        assert abs(score(3, 0) - score(0, 0)) > 1e-3  # it does depend on the offset

    @chex.variants(with_jit=True, without_jit=True)
    def test_rotation_preserves_norms(self):
        x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 6, 3, 8)), jnp.float32)
        y = self.variant(ops.apply_rope)(x, jnp.arange(6) * 7)
        np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)

    def test_position_zero_is_identity_and_layout_is_rotate_half(self):
        x = jnp.arange(4, dtype=jnp.float32).reshape(1, 1, 1, 4)
        np.testing.assert_allclose(ops.apply_rope(x, jnp.array([0])), x)
        # H = 4: pairs (0, 2) at angle p, (1, 3) at angle p / 100.
        y = ops.apply_rope(x, jnp.array([1]))[0, 0, 0]
        c0, s0, c1, s1 = np.cos(1), np.sin(1), np.cos(0.01), np.sin(0.01)
        np.testing.assert_allclose(y, [0 * c0 - 2 * s0, 1 * c1 - 3 * s1, 2 * c0 + 0 * s0, 3 * c1 + 1 * s1], rtol=1e-6)


def test_t5_buckets_bidirectional_hand_table():
    # relative_position = key - query; 16 buckets per direction, 8 exact, log-spaced to 128.
    table = {
        0: 0, -1: 1, -7: 7, -8: 8, -10: 8, -20: 10, -40: 12, -100: 15, -127: 15, -128: 15, -1000: 15,
        1: 17, 7: 23, 8: 24, 10: 24, 20: 26, 40: 28, 100: 31, 1000: 31,
    }
    rel = jnp.array(list(table))
    got = ops.t5_relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(got, list(table.values()))


def test_t5_buckets_unidirectional_hand_table():
    # Keys after the query share bucket 0; 16 exact offsets, then log-spaced to 128.
    table = {
        5: 0, 1: 0, 0: 0, -3: 3, -15: 15, -16: 16, -20: 17, -40: 23, -50: 24, -100: 30, -127: 31, -1000: 31,
    }
    rel = jnp.array(list(table))
    got = ops.t5_relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(got, list(table.values()))


def test_alibi_slopes_and_bias():
    np.testing.assert_allclose(ops.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    np.testing.assert_allclose(ops.alibi_slopes(4), [2.0 ** -(2 * (i + 1)) for i in range(4)])
    # 6 heads: the 4-head slopes, then every other slope of the 8-head series.
    np.testing.assert_allclose(ops.alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    bias = ops.alibi_bias(2, jnp.arange(3), jnp.arange(3))
    chex.assert_shape(bias, (1, 2, 3, 3))
    np.testing.assert_allclose(bias[0, 0], -(2.0**-4) * np.abs(np.arange(3)[:, None] - np.arange(3)[None]))


class CrossEntropyTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_ignores_minus_100_and_averages_real_tokens(self):
        logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]]))
        labels = jnp.array([[0, 1, -100]])
        expected = -(np.log(0.5) + np.log(0.8)) / 2
        np.testing.assert_allclose(self.variant(ops.cross_entropy)(logits, labels), expected, rtol=1e-6)

    def test_all_ignored_is_zero_not_nan(self):
        assert float(ops.cross_entropy(jnp.zeros((1, 2, 3)), jnp.full((1, 2), -100))) == 0.0

    def test_shape_mismatch_is_an_error(self):
        with pytest.raises(ValueError, match="do not match"):
            ops.cross_entropy(jnp.zeros((1, 2, 3)), jnp.zeros((1, 3), jnp.int32))
