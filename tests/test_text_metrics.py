"""The held-out metrics the BERT/T5 runs report beside accuracy: blank-span share, unigram baseline."""

import numpy as np

from txjax.tasks.mlm import unigram_baseline
from txjax.tasks.spans import blank_span_share, distinct_span_share, encoder_shuffled


def test_blank_span_share_counts_empty_and_whitespace_spans():
    assert blank_span_share(["<0>ab<1> <2>"]) == 2 / 3
    assert blank_span_share(["<0>x", "<0>\n\t<1>y"]) == 1 / 3
    assert blank_span_share(["", "no sentinel"]) == 0.0
    assert blank_span_share([]) == 0.0


def test_unigram_baseline_is_commonest_ordinary_token_accuracy():
    train = np.array([0, 0, 0, 0, 5, 5, 7])  # 0 is special: the commonest ordinary token is 5
    targets = np.array([[5, -100, 7], [5, 5, -100]])
    base = unigram_baseline(train, targets, special_ids=[0])
    assert base["token"] == 5 and base["accuracy"] == 0.75


def test_distinct_span_share_is_low_for_row_independent_spans():
    assert distinct_span_share(["<0> the<1>ab", "<0> the<1>cd"]) == 3 / 4
    assert distinct_span_share(["<0> the"] * 8) == 1 / 8
    assert distinct_span_share(["no sentinel"]) == 0.0


def test_encoder_shuffled_moves_only_encoder_rows():
    batch = {"enc_inputs": np.arange(6).reshape(3, 2), "enc_document_ids": np.arange(3)[:, None] * [1, 1],
             "dec_inputs": np.arange(3)[:, None], "targets": np.arange(3)[:, None]}
    out = encoder_shuffled(batch)
    np.testing.assert_array_equal(out["enc_inputs"], batch["enc_inputs"][[2, 0, 1]])
    np.testing.assert_array_equal(out["enc_document_ids"], batch["enc_document_ids"][[2, 0, 1]])
    for k in ("dec_inputs", "targets"):
        np.testing.assert_array_equal(out[k], batch[k])
