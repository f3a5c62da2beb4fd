"""Padding, packing, and the seeded, resumable BatchIterator."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax.data import (
    BatchIterator,
    CharTokenizer,
    IteratorState,
    PatchTokenizer,
    ar_shift,
    concat_documents,
    mlm_mask,
    nonpad_mask,
    pack_tokens,
    pad_batch,
)


def test_pad_batch_and_mask():
    tokens = pad_batch([[5, 6, 7], [8], []], length=4, pad_id=0)
    assert tokens.dtype == np.int32
    assert tokens.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]]
    assert nonpad_mask(tokens, 0).tolist() == [[True] * 3 + [False], [True] + [False] * 3,
                                               [False] * 4]
    with pytest.raises(ValueError, match="more than length=2"):
        pad_batch([[1, 2, 3]], length=2, pad_id=0)
    assert pad_batch([[1, 2, 3]], length=2, pad_id=0, truncate=True).tolist() == [[1, 2]]


def test_concat_and_pack():
    stream = concat_documents([[5, 6], [7], [8, 9, 10]], eot_id=0)
    assert stream.tolist() == [5, 6, 0, 7, 0, 8, 9, 10, 0]
    assert concat_documents([[1], [2]], eot_id=None).tolist() == [1, 2]
    rows = pack_tokens(stream, 4)
    assert rows.tolist() == [[5, 6, 0, 7], [0, 8, 9, 10]]  # tail dropped
    with pytest.raises(ValueError, match="shorter than seq_len"):
        pack_tokens(stream, 10)


def take(it, n):
    return [np.asarray(b).copy() for b in islice(it, n)]


def test_epochs_are_permutations_and_reshuffled():
    data = np.arange(20)
    it = BatchIterator(data, batch_size=4, seed=3)
    assert it.steps_per_epoch == 5
    e0 = np.concatenate(take(it, 5))
    e1 = np.concatenate(take(it, 5))
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(20))
    assert e0.tolist() != e1.tolist()
    assert it.state.epoch == 2 and it.state.step == 0


def test_seed_determinism_and_difference():
    a = take(BatchIterator(np.arange(50), 8, seed=1), 12)
    b = take(BatchIterator(np.arange(50), 8, seed=1), 12)
    c = take(BatchIterator(np.arange(50), 8, seed=2), 12)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))
    assert all(x.shape == (8,) for x in a)  # the remainder of 2 is dropped: fixed shapes


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 7), st.integers(0, 40), st.integers(0, 2 ** 31))
def test_resume_gives_the_same_stream(n, batch, stop, seed):
    batch = min(batch, n)
    transform = lambda b, rng: b * 1000 + rng.integers(0, 1000, size=b.shape)  # noqa: E731
    ref = take(BatchIterator(np.arange(n), batch, seed, transform=transform), stop + 10)
    it = BatchIterator(np.arange(n), batch, seed, transform=transform)
    take(it, stop)
    saved = json.loads(json.dumps(it.state.to_dict()))  # through a checkpoint file
    resumed = BatchIterator(np.arange(n), batch, seed, transform=transform,
                            state=IteratorState.from_dict(saved))
    rest = take(resumed, 10)
    for x, y in zip(rest, ref[stop:]):
        np.testing.assert_array_equal(x, y)


class Recorded(list):
    """A list that records which items were read: what a host's shard touches."""

    def __init__(self, items):
        super().__init__(items)
        self.read = set()

    def __getitem__(self, i):
        self.read.add(int(i))
        return super().__getitem__(i)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.sampled_from([1, 2, 3, 4]), st.integers(1, 3), st.integers(0, 2 ** 31))
def test_host_shards_are_the_rows_of_the_global_batch_and_read_nothing_else(n, hosts, per_host, seed):
    """Host i of `hosts` yields rows [i * b, (i + 1) * b) of every batch one host would yield
    (over several epochs), reads only the examples it yields, and resumes where it was."""
    batch = hosts * per_host
    if batch > n:
        batch, per_host = hosts, 1
    if batch > n:
        return
    steps = 3 * (n // batch) + 1
    whole = take(BatchIterator(np.arange(n), batch, seed), steps)
    for i in range(hosts):
        data = Recorded(range(n))
        it = BatchIterator(data, batch, seed, shard=(i, hosts), transform=lambda b, rng: np.asarray(b))
        got = take(it, steps)
        for k, g in enumerate(whole):
            np.testing.assert_array_equal(got[k], g[i * per_host: (i + 1) * per_host])
        assert data.read == set(np.concatenate(got).tolist())
        half = BatchIterator(np.arange(n), batch, seed, shard=(i, hosts))
        take(half, steps // 2)
        resumed = BatchIterator(np.arange(n), batch, seed, shard=(i, hosts), state=half.state.to_dict())
        for x, y in zip(take(resumed, steps - steps // 2), got[steps // 2:]):
            np.testing.assert_array_equal(x, y)


def test_shard_arguments_refused():
    with pytest.raises(ValueError, match="divisible"):
        BatchIterator(np.arange(10), 3, shard=(0, 2))
    with pytest.raises(ValueError, match="index"):
        BatchIterator(np.arange(10), 4, shard=(2, 2))
    with pytest.raises(ValueError, match="drop_remainder"):
        BatchIterator(np.arange(10), 4, shard=(0, 2), drop_remainder=False)


def test_adjacent_seeds_give_unrelated_epoch_orders():
    """Epoch e's order comes from SeedSequence([seed, 0, e]), not from seed + e (as Grain's own
    shuffle seeds it), so seed 1's first epoch is not seed 0's second."""
    a = np.concatenate(take(BatchIterator(np.arange(64), 8, seed=0), 16))
    b = np.concatenate(take(BatchIterator(np.arange(64), 8, seed=1), 8))
    assert (a[64:] != b).mean() > 0.5


def test_state_mismatch_and_range_refused():
    it = BatchIterator(np.arange(10), 2, seed=0)
    other = BatchIterator(np.arange(12), 2, seed=0)
    with pytest.raises(ValueError, match="num_examples"):
        other.set_state(it.state)
    with pytest.raises(ValueError, match="out of range"):
        it.set_state(IteratorState(0, 9, 0, 2, 10))


def test_num_epochs_and_remainder():
    it = BatchIterator(np.arange(7), 3, seed=0, num_epochs=2, drop_remainder=False)
    shapes = [b.shape[0] for b in it]
    assert shapes == [3, 3, 1, 3, 3, 1]
    with pytest.raises(ValueError, match="cannot fill one batch"):
        BatchIterator(np.arange(3), 4)
    plain = BatchIterator(np.arange(6), 3, shuffle=False, num_epochs=1)
    assert [b.tolist() for b in plain] == [[0, 1, 2], [3, 4, 5]]


def test_dict_and_list_data():
    data = {"x": np.arange(10) * 2, "y": np.arange(10)}
    for batch in islice(BatchIterator(data, 4, seed=0), 6):
        assert (batch["x"] == batch["y"] * 2).all()
    with pytest.raises(ValueError, match="one common length"):
        BatchIterator({"x": np.arange(3), "y": np.arange(4)}, 1)
    docs = [[5] * k for k in range(1, 9)]
    it = BatchIterator(docs, 3, seed=0, transform=lambda b, rng: pad_batch(b, 8, pad_id=0))
    batch = next(it)
    assert batch.shape == (3, 8) and batch.dtype == np.int32


def test_gpt_text_pipeline():
    """Char tokens -> one stream -> packed rows -> shifted (inputs, targets) batches."""
    text = "to be or not to be, that is the question. " * 20
    tok = CharTokenizer.from_corpus(text, "gpt")
    stream = concat_documents([tok.encode(text[:300]), tok.encode(text[300:])], tok.eot_id)
    rows = pack_tokens(stream, 17)
    it = BatchIterator(rows, 4, seed=0, transform=lambda b, rng: ar_shift(b))
    inputs, targets = next(it)
    assert inputs.shape == targets.shape == (4, 16)
    assert (inputs[:, 1:] == targets[:, :-1]).all()


def test_bert_mlm_pipeline_resumable():
    tok = CharTokenizer.from_corpus("abcdefgh", "bert")
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[tok.cls_id], tok.encode("abcdefgh"[: rng.integers(1, 8)]),
                            [tok.sep_id]]) for _ in range(30)]

    def transform(batch, rng):
        tokens = pad_batch(batch, 12, tok.pad_id)
        inputs, labels = mlm_mask(tokens, rng, mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                                  special_ids=tok.special_ids)
        return inputs, labels, nonpad_mask(tokens, tok.pad_id)

    a = BatchIterator(docs, 5, seed=4, transform=transform)
    first = [next(a) for _ in range(8)]
    b = BatchIterator(docs, 5, seed=4, transform=transform,
                      state=IteratorState(epoch=1, step=0, seed=4, batch_size=5, num_examples=30))
    for x, y in zip(first[6:], [next(b) for _ in range(2)]):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)
    inputs, labels, mask = first[0]
    assert inputs.shape == labels.shape == mask.shape == (5, 12)
    assert (labels[~mask] == -100).all()


def test_mnist_tokens_pipeline():
    images = (np.random.default_rng(0).random((10, 28, 28)) > 0.7).astype(np.uint8) * 255
    tokens = PatchTokenizer().encode(images)
    it = BatchIterator(tokens, 4, seed=0, transform=lambda b, rng: ar_shift(b))
    inputs, targets = next(it)
    assert inputs.shape == targets.shape == (4, 196)
    assert (inputs[:, 0] == 16).all()
