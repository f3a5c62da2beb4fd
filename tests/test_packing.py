"""Packed sequences (`document_ids_BT`): each document of a packed row gets the logits it gets alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax import GPT, T5, Bert, BertConfig, GPTConfig, T5Config, ops
from txjax.config import positions_for

jax.config.update("jax_numpy_rank_promotion", "raise")

TINY = dict(vocab_size=13, max_len=16, d_model=16, num_heads=2, num_layers=2, d_ff=32)
LENGTHS = (5, 1, 4)  # three documents in one row of 10; the middle one a single token


def tokens(seed, n, low=1):
    return jnp.asarray(np.random.default_rng(seed).integers(low, TINY["vocab_size"], size=(1, n)), jnp.int32)


def packed(seed, lengths=LENGTHS, low=1):
    """(documents, their concatenation [1, sum], document ids 0, 1, 2, ... [1, sum])."""
    docs = [tokens(seed + i, n, low) for i, n in enumerate(lengths)]
    ids_BT = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
    return docs, jnp.concatenate(docs, axis=1), ids_BT


def pieces(x_BT, lengths=LENGTHS):
    return np.split(np.asarray(x_BT), np.cumsum(lengths)[:-1], axis=1)


def test_document_positions_restart_at_each_change():
    ids_BT = jnp.array([[0, 0, 0, 1, 2, 2], [4, 4, 4, 4, 4, 4]])
    np.testing.assert_array_equal(ops.document_positions(ids_BT), [[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 5]])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.booleans())
def test_mask_sees_exactly_the_own_document(lengths, causal):
    """Query t sees key s iff they share a document (and s <= t when causal), for any packing.
    A last document fills the row to 30 tokens: one shape, one compilation for every example."""
    lengths = lengths + [30 - sum(lengths)] if sum(lengths) < 30 else lengths
    ids_T = np.repeat(np.arange(len(lengths)), lengths)
    positions_BT = ops.document_positions(jnp.asarray(ids_T[None]))
    mask = ops.attention_mask(positions_BT, positions_BT, causal=causal,
                              q_documents_BT=jnp.asarray(ids_T[None]), k_documents_BS=jnp.asarray(ids_T[None]))
    t = np.arange(ids_T.size)
    expected = (ids_T[:, None] == ids_T[None, :]) & ((t[None, :] <= t[:, None]) | (not causal))
    np.testing.assert_array_equal(mask[0, 0], expected)


@pytest.mark.parametrize("position", positions_for("gpt"))
def test_gpt_packed_documents_equal_each_alone(position):
    """Every encoding: absolute tables, rotary and the relative biases all restart per document."""
    model = GPT(GPTConfig(**TINY, position=position), rngs=nnx.Rngs(0))
    docs, row_BT, ids_BT = packed(0)
    logits_BTV = jax.jit(lambda t, d: model(t, document_ids_BT=d))(row_BT, ids_BT)
    for doc, got in zip(docs, pieces(logits_BTV)):
        np.testing.assert_allclose(got, model(doc), atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", positions_for("bert"))
def test_bert_packed_documents_equal_each_alone(position):
    """Bidirectional: no document sees another's tokens before or after it; segment ids still apply."""
    model = Bert(BertConfig(**TINY, position=position, pad_id=0), rngs=nnx.Rngs(0))
    docs, row_BT, ids_BT = packed(1)
    segments_BT = jnp.asarray(np.random.default_rng(5).integers(0, 2, size=row_BT.shape), jnp.int32)
    logits_BTV = jax.jit(lambda t, s, d: model(t, s, document_ids_BT=d))(row_BT, segments_BT, ids_BT)
    for doc, seg, got in zip(docs, pieces(segments_BT), pieces(logits_BTV)):
        np.testing.assert_allclose(got, model(doc, jnp.asarray(seg)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", positions_for("t5"))
def test_t5_packed_pairs_equal_each_alone(position):
    """Encoder and decoder packed alike; a decoder token reads only its own document's encoder output."""
    model = T5(T5Config(**TINY, position=position), rngs=nnx.Rngs(0))
    enc_lengths, dec_lengths = (4, 2, 5), (3, 3, 1)
    encs, enc_BS, enc_ids_BS = packed(2, enc_lengths)
    decs, dec_BT, dec_ids_BT = packed(7, dec_lengths, low=0)
    logits_BTV = jax.jit(model)(enc_BS, dec_BT, enc_ids_BS, dec_ids_BT)
    for enc, dec, got in zip(encs, decs, pieces(logits_BTV, dec_lengths)):
        np.testing.assert_allclose(got, model(enc, dec), atol=1e-5, rtol=0)


def test_padding_after_the_documents_changes_nothing():
    """Trailing pads with an id of their own (the packers' convention) and pad_id hidden as keys."""
    model = GPT(GPTConfig(**TINY, position="rope", pad_id=0), rngs=nnx.Rngs(0))
    docs, row_BT, ids_BT = packed(3, (4, 3))
    row_BT = jnp.pad(row_BT, ((0, 0), (0, 3)))
    ids_BT = jnp.pad(ids_BT, ((0, 0), (0, 3)), constant_values=2)
    logits_BTV = model(row_BT, document_ids_BT=ids_BT)
    for doc, got in zip(docs, pieces(logits_BTV[:, :7], (4, 3))):
        np.testing.assert_allclose(got, model(doc), atol=1e-5, rtol=0)


def test_one_document_per_row_is_the_plain_forward():
    model = GPT(GPTConfig(**TINY, position="alibi"), rngs=nnx.Rngs(0))
    row_BT = tokens(4, 9)
    np.testing.assert_allclose(model(row_BT, document_ids_BT=jnp.full_like(row_BT, 3)), model(row_BT),
                               atol=1e-6, rtol=0)


def test_random_positions_are_drawn_per_document():
    """While training with randomized positions, each document takes the row's first drawn positions."""
    model = GPT(GPTConfig(**TINY, position="learned", random_positions=16), rngs=nnx.Rngs(0))
    _, row_BT, ids_BT = packed(0)
    positions_BT = model.positions(row_BT, document_ids_BT=ids_BT)
    for piece in pieces(positions_BT):
        assert np.all(np.diff(piece) > 0) and piece.max() < 16
    np.testing.assert_array_equal(pieces(positions_BT)[2][0], pieces(positions_BT)[0][0, :4])


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("ids, match", [
    ([[0, 0, 1, 1, 0, 0, 2, 2, 2, 2]], "decrease inside row 0 \\(at token 4\\)"),
    ([[0, 0, 1]], "must have the shape of the tokens"),
    ([[0.0] * 10], "must be integers"),
])
def test_bad_document_ids_are_clear_errors(ids, match):
    model = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=match):
        model(tokens(0, 10), document_ids_BT=jnp.asarray(ids))


def test_t5_needs_both_sides_and_a_cache_refuses_documents():
    t5 = T5(T5Config(**TINY), rngs=nnx.Rngs(0))
    _, row_BT, ids_BT = packed(0)
    with pytest.raises(ValueError, match="both the encoder and the decoder"):
        t5(row_BT, row_BT, enc_document_ids_BS=ids_BT)
    gpt = GPT(GPTConfig(**TINY), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="a cache decodes one sequence per row"):
        gpt.forward(row_BT, gpt.init_cache(1, 12), document_ids_BT=ids_BT)


def test_packed_batch_loss_is_the_sum_of_the_documents_losses():
    """End to end: `NextTokenPacking` rows through `gpt_loss` score each document as alone,
    with no target across a document boundary."""
    from txjax.data import NextTokenPacking
    from txjax.train.steps import gpt_loss

    docs = [np.arange(1, 6), np.array([7, 8, 9]), np.arange(2, 12)]
    objective = NextTokenPacking(context=11, pad_id=0)
    batch = {k: jnp.asarray(v) for k, v in objective(objective.rows(docs)).items()}
    assert batch["inputs"].shape == (2, 11)  # 10 tokens alone in one row, 5 + 3 in the other
    model = GPT(GPTConfig(**TINY, position="learned", pad_id=0), rngs=nnx.Rngs(0))
    packed = jax.jit(gpt_loss)(model, batch)
    alone = [gpt_loss(model, {"inputs": jnp.asarray(d[None, :-1]), "targets": jnp.asarray(d[None, 1:])})
             for d in docs]
    assert int(packed.count) == sum(int(a.count) for a in alone) == 4 + 2 + 9
    np.testing.assert_allclose(packed.nll, sum(float(a.nll) for a in alone), rtol=1e-5)
