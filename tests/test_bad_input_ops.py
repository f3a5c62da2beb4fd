"""Bad input to `txjax.ops` (issue 15): a one-line error naming the value and the rule, or NaN under jit,
never a silently different answer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import ops

B, T, N, H, V = 2, 4, 2, 8, 5


def qkv(dtype=jnp.float32):
    x = jax.random.normal(jax.random.key(0), (B, T, N, H))
    return x.astype(dtype), x.astype(dtype), x.astype(dtype)


CAUSAL = ops.mask_to_bias(ops.causal_mask(T))


# ---------------------------------------------------------------- attention

@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("bias, match", [
    (ops.causal_mask(T), r"bias is boolean.*mask_to_bias"),
    (jnp.zeros((B, T, T)), r"bias of shape \(2, 4, 4\) must be rank 4, \[B\|1, N\|1, T\|1, S\|1\]"),
    (jnp.zeros((T, T)), r"must be rank 4"),
    (jnp.zeros((B, N, T + 1, T)), r"bias of shape \(2, 2, 5, 4\) must be .*\[2\|1, 2\|1, 4\|1, 4\|1\]"),
    (jnp.zeros((3, 1, T, T)), r"bias of shape \(3, 1, 4, 4\)"),
    (jnp.zeros((1, 1, T, T), jnp.int32), r"bias must be floating point, got dtype int32"),
], ids=["bool", "BTS", "TS", "wrong-T", "wrong-B", "int"])
def test_bad_bias_is_refused(bias, match, impl):
    with pytest.raises(ValueError, match=match):
        ops.dot_product_attention(*qkv(), bias, implementation=impl)


def test_bad_bias_is_refused_by_attention_weights_too():
    q, k, _ = qkv()
    with pytest.raises(ValueError, match="bias is boolean"):
        ops.attention_weights(q, k, ops.causal_mask(T))


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_non_float_qkv_is_refused(dtype, impl):
    with pytest.raises(ValueError, match=f"q, k and v must be floating point, got dtype {jnp.dtype(dtype).name}"):
        ops.dot_product_attention(*qkv(dtype), implementation=impl)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_rank3_inputs_are_refused(impl):
    """Already refused before issue 15 (kept here so it stays so): [B, T, D] is not reinterpreted."""
    x = jnp.zeros((B, T, N * H))
    with pytest.raises(ValueError, match=r"must be \[B, T, N, H\] and \[B, S, K, H\], got \(2, 4, 16\)"):
        ops.dot_product_attention(x, x, x, implementation=impl)


def test_lists_are_taken_as_arrays():
    q, k, v = qkv()
    np.testing.assert_allclose(ops.dot_product_attention(q.tolist(), k.tolist(), v.tolist(), np.asarray(CAUSAL)),
                               ops.dot_product_attention(q, k, v, CAUSAL), atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("bias, match", [
    (None, r"causal_block_size=2 .* bias is None"),
    (jnp.zeros((1, 1, T, T)), r"causal_block_size=2 .* not -inf at every key after its query"),
    (ops.mask_to_bias(ops.causal_mask(T).at[..., 0, 3].set(True)), r"not -inf at every key after its query"),
], ids=["none", "zeros", "one-leak"])
def test_causal_blocks_without_a_causal_bias_are_refused(bias, match, impl):
    """Blocks skip the keys after each query; a bias that does not hide them would change the answer."""
    with pytest.raises(ValueError, match=match):
        ops.dot_product_attention(*qkv(), bias, implementation=impl, causal_block_size=2)


def test_causal_blocks_with_a_traced_bias_trust_the_caller():
    """Under jit the bias is unknown: the documented promise holds, and a causal one gives the full result."""
    q, k, v = qkv()
    blocked = jax.jit(lambda b: ops.dot_product_attention(q, k, v, b, causal_block_size=2))(CAUSAL + 0.5)
    np.testing.assert_allclose(blocked, ops.dot_product_attention(q, k, v, CAUSAL + 0.5), atol=1e-6)


@pytest.mark.parametrize("size", [0, -1, True, 2.0])
def test_bad_causal_block_size_is_refused(size):
    with pytest.raises(ValueError, match=f"causal_block_size must be a positive int or None, got {size!r}"):
        ops.dot_product_attention(*qkv(), CAUSAL, causal_block_size=size)


def test_no_keys_at_all_gives_zeros_like_a_fully_masked_row():
    q, _, _ = qkv()
    empty = jnp.zeros((B, 0, N, H))
    np.testing.assert_array_equal(ops.dot_product_attention(q, empty, empty), jnp.zeros_like(q))
    assert ops.dot_product_attention(empty, empty, empty).shape == (B, 0, N, H)


# ---------------------------------------------------------------- cross-entropy

def logits_labels(label):
    logits = jnp.zeros((1, 3, V)).at[0, :, V - 1].set(5.0).at[0, :, 0].set(3.0)
    return logits, jnp.array([[1, label, -100]])


@pytest.mark.parametrize("label", [-1, -V, V, -99, 10**6])
def test_out_of_range_labels_are_errors_eagerly(label):
    logits, labels = logits_labels(label)
    match = rf"labels must be in \[0, {V}\) or ignore_index=-100, got {label}"
    with pytest.raises(ValueError, match=match):
        ops.cross_entropy(logits, labels)
    with pytest.raises(ValueError, match=match):
        ops.token_nll(logits, labels)


@pytest.mark.parametrize("label", [-1, -V, V])
def test_out_of_range_labels_are_nan_under_jit(label):
    """Never another class: label -1 used to score class V-1 and -V class 0."""
    logits, labels = logits_labels(label)
    assert np.isnan(jax.jit(ops.cross_entropy)(logits, labels))
    nll, weights = jax.jit(ops.token_nll)(logits, labels)
    assert np.isnan(nll[0, 1]) and np.isfinite(nll[0, 0]) and nll[0, 2] == 0.0
    np.testing.assert_array_equal(weights, [[True, True, False]])


def test_ignore_index_and_real_labels_still_score():
    logits, labels = logits_labels(2)
    expected = -jax.nn.log_softmax(logits[0, :2], axis=-1)[jnp.arange(2), jnp.array([1, 2])].mean()
    np.testing.assert_allclose(jax.jit(ops.cross_entropy)(logits, labels), expected, rtol=1e-6)
    np.testing.assert_allclose(ops.cross_entropy(logits.tolist(), labels.tolist()), expected, rtol=1e-6)


def test_float_labels_and_an_empty_vocabulary_are_errors():
    logits, labels = logits_labels(2)
    with pytest.raises(ValueError, match="labels must be integer class ids, got dtype float32"):
        ops.cross_entropy(logits, labels.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"empty vocabulary: logits of shape \(1, 3, 0\)"):
        ops.cross_entropy(jnp.zeros((1, 3, 0)), jnp.zeros((1, 3), jnp.int32))


# ---------------------------------------------------------------- T5 buckets, norms, RoPE

@pytest.mark.parametrize("kwargs, match", [
    (dict(num_buckets=32, max_distance=8), r"max_distance=8 must exceed the exact-offset range 8 \(num_buckets // 4"),
    (dict(num_buckets=32, max_distance=16, bidirectional=False), r"max_distance=16 must exceed .* 16 \(num_buckets // 2"),
    (dict(num_buckets=3), r"num_buckets must be an int >= 4, got 3"),
    (dict(num_buckets=32.0), r"num_buckets must be an int >= 4, got 32.0"),
])
def test_bad_t5_bucket_settings_are_refused(kwargs, match):
    """num_buckets=32, max_distance=8 used to return bucket -2147483641."""
    with pytest.raises(ValueError, match=match):
        ops.t5_relative_position_bucket(jnp.arange(-20, 20), **kwargs)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_smallest_accepted_max_distance_keeps_buckets_in_range(bidirectional):
    max_distance = 32 // (4 if bidirectional else 2) + 1
    buckets = ops.t5_relative_position_bucket(jnp.arange(-300, 300), bidirectional, 32, max_distance)
    assert int(buckets.min()) >= 0 and int(buckets.max()) < 32


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norms_refuse_integer_input(norm):
    """layer_norm of an int array used to return values in {-1, 0, 1}."""
    x = jnp.arange(6).reshape(2, 3)
    call = (lambda x: ops.layer_norm(x, jnp.ones(3), jnp.zeros(3))) if norm == "layer" else (
        lambda x: ops.rms_norm(x, jnp.ones(3)))
    with pytest.raises(ValueError, match=f"{norm}_norm: x must be floating point, got dtype int32"):
        call(x)
    np.testing.assert_allclose(call(x.astype(jnp.float32).tolist()), call(x.astype(jnp.float32)))


def test_layer_norm_bias_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"layer_norm: bias of shape \(5,\) does not fit input width 8"):
        ops.layer_norm(jnp.ones((2, 8)), jnp.ones(8), jnp.zeros(5))


@pytest.mark.parametrize("rotate", ["rope", "xpos"])
@pytest.mark.parametrize("positions", [jnp.arange(T + 1), jnp.arange(T - 1), jnp.zeros((3, T), jnp.int32)],
                         ids=["longer", "shorter", "wrong-batch"])
def test_rotary_positions_must_fit_the_sequence(positions, rotate):
    x = jnp.ones((B, T, N, H))
    f = ops.apply_rope if rotate == "rope" else ops.apply_xpos
    with pytest.raises(ValueError, match=rf"apply_{rotate}: positions of shape \({positions.shape[0]}, ?.*"
                                         rf"do not fit x of shape \(2, 4, 2, 8\): expected \[T\] = \[4\] or \[B\|1, T\]"):
        f(x, positions)
