"""AR shift, BERT MLM masking and T5 span corruption: exact counts, hand cases, properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax.data.objectives import (
    IGNORE_INDEX,
    ar_shift,
    mlm_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
    t5_span_corruption,
    t5_span_corruption_batch,
)

BERT_SPECIALS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK]
MASK = 4
SEEDS = st.integers(0, 2 ** 32 - 1)


# --------------------------------------------------------------------------- AR


def test_ar_shift_hand_case():
    tokens = np.array([[5, 6, 7, 8], [9, 10, 0, 0]])
    inputs, targets = ar_shift(tokens)
    assert inputs.tolist() == [[5, 6, 7], [9, 10, 0]]
    assert targets.tolist() == [[6, 7, 8], [10, 0, 0]]
    _, masked = ar_shift(tokens, loss_mask_BT=tokens != 0)
    assert masked.tolist() == [[6, 7, 8], [10, -100, -100]]
    with pytest.raises(ValueError, match="T >= 2"):
        ar_shift(np.array([[1]]))


# --------------------------------------------------------------------------- MLM


def bert_rows(rng: np.random.Generator, b: int, t: int, vocab: int) -> np.ndarray:
    """[CLS] words [SEP] [PAD]...: rows of random real lengths."""
    rows = np.zeros((b, t), dtype=np.int32)
    for i in range(b):
        n = rng.integers(0, t - 1)
        rows[i, 0] = 2
        rows[i, 1: 1 + n] = rng.integers(5, vocab, n)
        rows[i, 1 + n] = 3
    return rows


@settings(max_examples=60, deadline=None)
@given(SEEDS, st.integers(1, 6), st.integers(2, 40), st.floats(0.05, 0.6))
def test_mlm_exact_counts_and_specials(seed, b, t, rate):
    rng = np.random.default_rng(seed)
    tokens = bert_rows(rng, b, t, vocab=50)
    inputs, labels = mlm_mask(tokens, rng, mask_id=MASK, vocab_size=50,
                              special_ids=BERT_SPECIALS, rate=rate)
    assert inputs.shape == labels.shape == tokens.shape
    assert inputs.dtype == labels.dtype == np.int32
    special = np.isin(tokens, BERT_SPECIALS)
    chosen = labels != IGNORE_INDEX
    n = (~special).sum(axis=1)
    expected = np.array([max(1, round(rate * int(k))) if k else 0 for k in n])
    np.testing.assert_array_equal(chosen.sum(axis=1), expected)
    assert not (chosen & special).any()  # specials are never chosen
    np.testing.assert_array_equal(labels[chosen], tokens[chosen])
    np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])  # untouched elsewhere
    # a chosen token is [MASK], itself, or an ordinary (non-special) token
    changed = inputs[chosen]
    assert ((changed == MASK) | ~np.isin(changed, BERT_SPECIALS)).all()


def test_mlm_hand_counts():
    tokens = np.array([[2] + list(range(10, 30)) + [3, 0, 0]])  # 20 ordinary tokens
    _, labels = mlm_mask(tokens, 0, mask_id=MASK, vocab_size=100, special_ids=BERT_SPECIALS)
    assert (labels != -100).sum() == 3  # round(0.15 * 20)
    short = np.array([[2, 10, 3, 0]])
    _, labels = mlm_mask(short, 0, mask_id=MASK, vocab_size=100, special_ids=BERT_SPECIALS)
    assert (labels != -100).sum() == 1  # at least one
    only_specials = np.array([[2, 3, 0, 0]])
    inputs, labels = mlm_mask(only_specials, 0, mask_id=MASK, vocab_size=100,
                              special_ids=BERT_SPECIALS)
    assert (labels == -100).all() and (inputs == only_specials).all()


def test_mlm_proportions_within_binomial_bounds():
    rng = np.random.default_rng(123)
    vocab = 1000
    tokens = rng.integers(5, vocab, size=(400, 128)).astype(np.int32)
    inputs, labels = mlm_mask(tokens, 7, mask_id=MASK, vocab_size=vocab,
                              special_ids=BERT_SPECIALS)
    chosen = labels != -100
    m = int(chosen.sum())
    assert m == 400 * round(0.15 * 128)
    masked = (inputs[chosen] == MASK).sum()
    same = (inputs[chosen] == tokens[chosen]).sum()
    randomised = m - masked - same
    # a random token equals the original with probability 1/995, so "same" is ~10%
    for count, p in ((masked, 0.8), (randomised, 0.1 * (1 - 1 / 995)), (same, 0.1 + 0.1 / 995)):
        sd = np.sqrt(m * p * (1 - p))
        assert abs(count - m * p) < 5 * sd, (count, m * p, sd)
    # random replacements are uniform over ordinary ids: the mean is near the middle
    rand_vals = inputs[chosen & (inputs != MASK) & (inputs != tokens)]
    assert abs(rand_vals.mean() - (5 + vocab - 1) / 2) < 5 * np.std(np.arange(5, vocab)) / np.sqrt(
        rand_vals.size)


def test_mlm_deterministic_and_validated():
    tokens = np.array([[2, 10, 11, 12, 13, 3]] * 4)
    kw = dict(mask_id=MASK, vocab_size=20, special_ids=BERT_SPECIALS)
    a, b = mlm_mask(tokens, 5, **kw), mlm_mask(tokens, 5, **kw)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="mask_id"):
        mlm_mask(tokens, 0, mask_id=9, vocab_size=20, special_ids=BERT_SPECIALS)
    with pytest.raises(ValueError, match="token ids"):
        mlm_mask(tokens + 10, 0, **kw)
    with pytest.raises(TypeError, match="rng"):
        mlm_mask(tokens, "seed", **kw)


# --------------------------------------------------------------------------- T5


def test_t5_hand_case():
    tokens = np.arange(10, 16)
    mask = np.array([True, True, False, False, True, False])
    assert noise_span_to_unique_sentinel(tokens, mask, 1000).tolist() == [999, 12, 13, 998, 15]
    assert nonnoise_span_to_unique_sentinel(tokens, mask, 1000).tolist() == [10, 11, 999, 14, 998]


def rebuild(inputs: np.ndarray, targets: np.ndarray, vocab_size: int, num_sentinels: int
            ) -> list[int]:
    """Undo span corruption: each sentinel in inputs takes what follows it in targets."""
    is_sentinel = lambda x: x >= vocab_size - num_sentinels  # noqa: E731
    spans, current = {}, None
    for x in targets.tolist():
        if is_sentinel(x):
            current = x
            spans[current] = []
        elif current is not None:
            spans[current].append(x)
    out = []
    for x in inputs.tolist():
        out.extend(spans.get(x, []) if is_sentinel(x) else [x])
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.floats(0.01, 0.99), st.floats(0.5, 10.0), SEEDS)
def test_noise_mask_counts_and_rebuild(length, density, mean_span, seed):
    mask = random_spans_noise_mask(length, density, mean_span, rng=seed)
    assert mask.shape == (length,) and mask.dtype == bool
    num_noise = int(mask.sum())
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    if length == 1:
        assert num_noise == 0
        return
    want_noise = min(max(int(np.round(length * density)), 1), length - 1)
    want_spans = max(int(np.round(want_noise / mean_span)), 1)
    want_spans = min(want_spans, want_noise, length - want_noise)
    assert num_noise == want_noise
    assert len(starts) == want_spans
    assert not mask[0] and mask[-1]  # starts with non-noise, ends with noise

    vocab = 5000
    tokens = np.random.default_rng(seed).integers(10, 1000, length)
    inputs = noise_span_to_unique_sentinel(tokens, mask, vocab)
    targets = nonnoise_span_to_unique_sentinel(tokens, mask, vocab)
    sent_in = inputs[inputs >= 1000]
    assert sent_in.tolist() == list(range(vocab - 1, vocab - 1 - want_spans, -1))
    assert len(inputs) == length - num_noise + want_spans
    assert rebuild(inputs, targets, vocab, want_spans + 1) == tokens.tolist()


def test_noise_mask_reference_example():
    """T5 defaults on 568 raw tokens -> 85 noise tokens in 28 spans (T5's 512/114 setup)."""
    mask = random_spans_noise_mask(568, 0.15, 3.0, rng=0)
    assert mask.sum() == 85
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    assert starts.sum() == 28
    assert random_spans_helper(512, 0.15, 3.0) == (568, 114)


@settings(max_examples=200, deadline=None)
@given(st.integers(8, 300), st.floats(0.05, 0.5), st.floats(1.0, 30.0), SEEDS)
def test_helper_lengths_always_fit_the_corruption(inputs_length, density, mean_span, seed):
    """A row of the helper's raw length corrupts to at most inputs_length / targets_length
    tokens (with EOS), also where round(noise / mean span) is 0 and the mask still makes one span."""
    raw, targets_length = random_spans_helper(inputs_length, density, mean_span)
    ex = t5_span_corruption(np.arange(raw) % 50 + 2, seed, vocab_size=100, eos_id=1, pad_id=0,
                            inputs_length=inputs_length, targets_length=targets_length,
                            noise_density=density, mean_noise_span_length=mean_span)
    assert ex["encoder_inputs"][-1] != 0 or density == 0.5  # the raw length fills the encoder


def test_helper_counts_the_one_span_of_a_long_mean_span():
    """32 encoder slots, mean span 20: 35 raw tokens make 5 noise tokens in one span and fill them.
    T5's helper rounds 6 / 20 to no span at all and handed out 37 tokens, one too many."""
    assert random_spans_helper(32, 0.15, 20.0) == (35, 7)
    assert random_spans_helper(64, 0.15, 20.0) == (73, 13)


def test_noise_mask_composition_is_uniform():
    """Span lengths of 6 noise tokens in 2 spans: 5 compositions, each ~1/5 of the time."""
    counts = {}
    rng = np.random.default_rng(0)
    for _ in range(2000):
        m = random_spans_noise_mask(20, 0.3, 3.0, rng)
        # non-noise first, noise last: read the two noise span lengths
        starts = np.flatnonzero(m & ~np.concatenate([[False], m[:-1]]))
        first = int(np.argmax(~m[starts[0]:])) if len(starts) == 2 else None
        counts[first] = counts.get(first, 0) + 1
    assert sorted(counts) == [1, 2, 3, 4, 5]
    for c in counts.values():
        assert abs(c - 400) < 5 * np.sqrt(2000 * 0.2 * 0.8)


def test_t5_example_shapes_and_padding():
    tokens = np.arange(5, 5 + 568)
    ex = t5_span_corruption(tokens, 3, vocab_size=32100, eos_id=1, pad_id=0,
                            inputs_length=512, targets_length=114)
    enc, dec_in, dec_tgt, labels = (ex[k] for k in
                                    ("encoder_inputs", "decoder_inputs", "decoder_targets",
                                     "labels"))
    assert enc.shape == (512,) and dec_tgt.shape == dec_in.shape == labels.shape == (114,)
    assert all(v.dtype == np.int32 for v in ex.values())
    n_enc, n_tgt = int((enc != 0).sum()), int((dec_tgt != 0).sum())
    assert enc[n_enc - 1] == 1 and dec_tgt[n_tgt - 1] == 1  # EOS ends both
    assert dec_in[0] == 0 and dec_in[1:].tolist() == dec_tgt[:-1].tolist()
    assert (labels[:n_tgt] == dec_tgt[:n_tgt]).all() and (labels[n_tgt:] == -100).all()
    assert dec_tgt[0] == 32099  # targets start with <extra_id_0>
    assert rebuild(enc[: n_enc - 1], dec_tgt[: n_tgt - 1], 32100, 100) == tokens.tolist()


def test_t5_example_too_long_and_batch():
    with pytest.raises(ValueError, match="more than inputs_length"):
        t5_span_corruption(np.arange(5, 105), 0, vocab_size=1000, eos_id=1, pad_id=0,
                           inputs_length=50, targets_length=50)
    rows = [np.arange(5, 25), np.arange(100, 130)]
    kw = dict(vocab_size=1000, eos_id=1, pad_id=0, inputs_length=32, targets_length=16)
    a = t5_span_corruption_batch(rows, 9, **kw)
    b = t5_span_corruption_batch(rows, 9, **kw)
    assert a["encoder_inputs"].shape == (2, 32) and a["labels"].shape == (2, 16)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])  # a seed fixes the result
