"""The held-out metrics the BERT/T5 runs report beside accuracy: blank-span share, unigram baseline."""

import numpy as np

from txjax.tasks.mlm import unigram_baseline
from txjax.tasks.spans import blank_span_share


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
