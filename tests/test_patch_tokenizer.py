"""The binary patch tokenizer of the MNIST model: sizes, the bit order by hand, exact round trips, bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_data_mnist import REAL_NPZ
from txjax.data.mnist import PatchTokenizer


def test_patch_tokenizer_sizes():
    tok = PatchTokenizer()
    assert (tok.vocab_size, tok.bos_id, tok.seq_len) == (17, 16, 197)
    assert PatchTokenizer(patch=1).vocab_size == 3
    assert PatchTokenizer(patch=4).vocab_size == 2 ** 16 + 1
    assert PatchTokenizer(patch=4).seq_len == 50
    with pytest.raises(ValueError, match="33,554,432"):
        PatchTokenizer(patch=5)
    with pytest.raises(ValueError, match="not divisible"):
        PatchTokenizer(patch=3)
    assert PatchTokenizer(patch=3, image_size=27).seq_len == 82


def test_patch_bit_order_hand_case():
    img = np.zeros((1, 28, 28), np.uint8)
    img[0, 0, 0] = 255  # patch 0: top-left only -> 0b1000 = 8
    img[0, 0, 3] = 255  # patch 1: top-right only -> 0b0100 = 4
    img[0, 1, 4] = 255  # patch 2: bottom-left only -> 0b0010 = 2
    img[0, 1, 7] = 255  # patch 3: bottom-right only -> 0b0001 = 1
    img[0, 2:4, 0:2] = 255  # patch (row 1, col 0) all on -> 15
    tokens = PatchTokenizer().encode(img)
    assert tokens.shape == (1, 197) and tokens.dtype == np.int32
    assert tokens[0, :5].tolist() == [16, 8, 4, 2, 1]
    assert tokens[0, 1 + 14] == 15
    assert tokens[0, 6:15].tolist() == [0] * 9


def test_threshold_uint8_and_float_agree():
    img = np.resize(np.arange(256, dtype=np.uint8), (2, 28, 28))
    tok = PatchTokenizer(threshold=0.5)
    assert tok.binarize(img).sum() == (img > 127.5).sum()
    np.testing.assert_array_equal(tok.encode(img), tok.encode(img.astype(np.float32) / 255))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.integers(1, 3), st.integers(0, 2 ** 32 - 1))
def test_round_trip_binary_images(patch, batch, seed):
    rng = np.random.default_rng(seed)
    img = (rng.random((batch, 28, 28)) < rng.random()).astype(np.uint8) * 255
    tok = PatchTokenizer(patch=patch)
    tokens = tok.encode(img)
    assert tokens.shape == (batch, tok.seq_len)
    assert tokens[:, 0].tolist() == [tok.bos_id] * batch
    assert tokens[:, 1:].min() >= 0 and tokens[:, 1:].max() < tok.bos_id
    np.testing.assert_array_equal(tok.decode(tokens), img)
    np.testing.assert_array_equal(tok.decode(tokens[:, 1:], dtype=np.float32), img / 255)
    np.testing.assert_array_equal(tok.encode(tok.decode(tokens)), tokens)


@pytest.mark.parametrize("images, match", [
    (np.zeros((2, 28, 27), np.uint8), r"\[B, 28, 28\]"),
    (np.zeros((28, 28), np.uint8), r"image\[None\]"),
    (np.zeros((1, 28, 28), np.int32), "uint8 or floats"),
    (np.zeros((1, 28, 28), bool), "uint8 or floats"),
    (np.full((1, 28, 28), 1.5, np.float32), r"\[0, 1\]"),
    (np.full((1, 28, 28), np.nan, np.float32), r"\[0, 1\]"),
])
def test_bad_images(images, match):
    with pytest.raises(ValueError, match=match):
        PatchTokenizer().encode(images)


def test_bad_tokens():
    tok = PatchTokenizer()
    good = tok.encode(np.zeros((1, 28, 28), np.uint8))
    with pytest.raises(ValueError, match="BOS"):
        tok.decode(good[:, ::-1])
    bad = good.copy()
    bad[0, 5] = 16
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        tok.decode(bad)
    with pytest.raises(ValueError, match="shape"):
        tok.decode(good[:, :100])


@pytest.mark.skipif(not REAL_NPZ.is_file(), reason="shared MNIST not beside the repo")
def test_real_digits_tokenize():
    x = np.load(REAL_NPZ)["x_test"][:64]
    tok = PatchTokenizer()
    tokens = tok.encode(x)
    assert tokens.shape == (64, 197)
    # the binarised digit survives the round trip
    np.testing.assert_array_equal(tok.decode(tokens) > 0, x > 127.5)
    # real digits are mostly background: id 0 dominates
    assert (tokens[:, 1:] == 0).mean() > 0.6
