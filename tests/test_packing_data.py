"""Packed sequences (txjax.data.packing, txjax.data.bins): documents, rows and document ids,
first fit, and the three objectives on packed rows, as properties over random documents."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txjax.data import (
    IGNORE_INDEX,
    BatchIterator,
    CharTokenizer,
    MLMPacking,
    NextTokenPacking,
    SpanPacking,
    first_fit,
    pack_documents,
    pack_rows,
    padding_report,
    padding_share,
    random_spans_helper,
    random_spans_noise_mask,
    span_lengths,
    split_documents,
    t5_span_corruption,
)
from txjax.data.packing import main

FAST = settings(max_examples=60, deadline=None)
LENGTHS = st.lists(st.integers(0, 40), min_size=1, max_size=25).filter(any)  # some document not empty


def runs(ids_L: np.ndarray, n: int) -> list[tuple[int, int]]:
    """(start, stop) of each document run among the first n positions."""
    if n == 0:
        return []
    starts = [0, *(np.flatnonzero(np.diff(ids_L[:n])) + 1).tolist()]
    return list(zip(starts, [*starts[1:], n]))


def id_docs(lengths: list[int]) -> list[np.ndarray]:
    """Document i holds 1000 * i + 0, 1, 2, ...: every token says where it came from."""
    return [1000 * i + np.arange(n) for i, n in enumerate(lengths)]


def check_ids(ids_NL: np.ndarray, lengths_N: np.ndarray) -> None:
    """Non-decreasing, runs numbered 0, 1, ... and the padding the id after the last one."""
    assert ids_NL.dtype == np.int32
    assert (np.diff(ids_NL, axis=1) >= 0).all()
    for ids_L, n in zip(ids_NL, lengths_N):
        assert [ids_L[a] for a, _ in runs(ids_L, n)] == list(range(len(runs(ids_L, n))))
        assert (ids_L[n:] == len(runs(ids_L, n))).all()


# --------------------------------------------------------------------------- documents


def test_split_documents_on_blank_lines():
    text = "\n\nFirst:\nBefore we proceed.\n\n\n  \nAll:\n  Speak.  \n \t \nA\r\n\r\nB\n\n\n"
    assert split_documents(text) == ["First:\nBefore we proceed.", "All:\n  Speak.", "A", "B"]
    assert split_documents(" \n\n ") == []


@FAST
@given(LENGTHS, st.integers(1, 16), st.booleans())
def test_pack_rows_keeps_every_token_once_in_order(lengths, length, packing):
    docs = id_docs(lengths)
    rows = pack_rows(docs, length, pad_id=5, packing=packing)  # 5 also occurs inside documents
    tokens, ids, used = rows["tokens"], rows["document_ids"], rows["lengths"]
    assert tokens.dtype == np.int32 and tokens.shape == ids.shape == (len(used), length)
    check_ids(ids, used)
    assert (tokens == np.where(np.arange(length) < used[:, None], tokens, 5)).all()  # padding: pad_id
    chunks = [(i, j) for i, n in enumerate(lengths) for j in range(0, n, length)]
    seen = []
    for row, ids_L, n in zip(tokens, ids, used):
        in_row = []
        for a, b in runs(ids_L, n):
            doc, first = divmod(int(row[a]), 1000)
            assert first % length == 0 and row[a:b].tolist() == (1000 * doc + np.arange(first, first + b - a)).tolist()
            assert b - a == min(length, lengths[doc] - first)  # whole chunks only
            in_row.append((doc, first))
        assert in_row == sorted(in_row)  # documents keep their order inside a row
        seen += in_row
    assert sorted(seen) == chunks  # every chunk exactly once
    assert len(used) <= len(chunks)
    if not packing:
        assert len(used) == len(chunks) and ids.max() <= 1
    assert all(np.array_equal(x, y) for x, y in zip(pack_documents(docs, length, 5, packing=packing),
                                                   (tokens, ids)))


def test_pack_documents_hand_case():
    tokens, ids = pack_documents([[1, 2, 3], [4], [5, 6, 7, 8, 9], [7, 0]], 4, pad_id=0)
    assert tokens.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 7, 0, 0]]
    assert ids.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 2]]
    tokens, ids = pack_documents([[1, 2, 3], [4]], 4, pad_id=0, packing=False)
    assert tokens.tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]] and ids.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]


@pytest.mark.parametrize("docs, length, match", [
    ([[1, 2]], 0, "length must be an int >= 1"),
    ([], 4, "non-empty sequence"),
    ([[], []], 4, "all 2 documents are empty"),
    ([[[1, 2]]], 4, "document 0 must be a 1-D"),
    ([[1.5, 2.0]], 4, "int ids"),
])
def test_pack_rows_rejects_bad_input(docs, length, match):
    with pytest.raises(ValueError, match=match):
        pack_rows(docs, length, 0)


def test_padding_share_counts_trailing_padding():
    tokens, ids = pack_documents([[1, 0, 2], [3, 0], [4, 5, 6, 7]], 4, pad_id=0)  # 0 inside documents
    assert tokens.tolist() == [[1, 0, 2, 0], [3, 0, 0, 0], [4, 5, 6, 7]]
    assert padding_share(tokens, 0, ids) == pytest.approx(3 / 12)  # the real 0 of [3, 0] is not padding
    assert padding_share(tokens, 0) == pytest.approx(4 / 12)  # without ids it is
    with pytest.raises(ValueError, match="non-empty"):
        padding_share(np.zeros((0, 3)), 0)


# --------------------------------------------------------------------------- first fit


def first_fit_reference(sizes, capacity):
    """Quadratic first fit, for comparison."""
    free, rows = [], []
    for need in sizes:
        r = next((r for r, f in enumerate(free) if all(x >= s for x, s in zip(f, need))), len(free))
        if r == len(free):
            free.append(list(capacity))
        free[r] = [x - s for x, s in zip(free[r], need)]
        rows.append(r)
    return rows


@FAST
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 6)), min_size=1, max_size=40))
def test_first_fit_matches_quadratic_reference(sizes):
    assert first_fit([s for s, _ in sizes], [10]).tolist() == first_fit_reference([(s,) for s, _ in sizes], [10])
    assert (first_fit(sizes, [10, 6], max_visits=10 ** 9).tolist()
            == first_fit_reference(sizes, [10, 6]))


def test_first_fit_two_dimensions_stays_fast_and_valid_when_room_is_split():
    """Rows alternate encoder room / decoder room, then many small items: the bounded search
    gives up and fills the last row instead of scanning every row each time."""
    sizes = np.array([[128, 1], [1, 29]] * 1500 + [[1, 1]] * 1500)
    rows = first_fit(sizes, [128, 29])
    assert rows.max() + 1 <= 3000 + 1500 // 28 + 2  # close to exact first fit (3054)
    for k, cap in enumerate((128, 29)):
        assert np.bincount(rows, weights=sizes[:, k]).max() <= cap
    assert set(rows.tolist()) == set(range(rows.max() + 1))
    with pytest.raises(ValueError, match="item sizes"):
        first_fit([[3, 30]], [128, 29])


# --------------------------------------------------------------------------- next token


@FAST
@given(LENGTHS, st.integers(1, 12), st.booleans(), st.booleans())
def test_next_token_targets_never_cross_documents(lengths, context, packing, eot):
    obj = NextTokenPacking(context, pad_id=0, eot_id=0 if eot else None)  # GPT: eot == pad
    docs = [d + 1 for d in id_docs(lengths)]
    rows = obj.rows(docs, packing=packing)
    batch = obj(rows, None)
    tokens, ids, used = rows["tokens"], rows["document_ids"], rows["lengths"]
    assert batch["inputs"].shape == batch["targets"].shape == batch["document_ids"].shape == (len(used), context)
    assert (batch["inputs"] == tokens[:, :-1]).all() and (batch["document_ids"] == ids[:, :-1]).all()
    check_ids(batch["document_ids"], np.minimum(used, context))
    for row, ids_L, n, tgt in zip(tokens, ids, used, batch["targets"]):
        want = np.full(context, IGNORE_INDEX)
        for a, b in runs(ids_L, n):
            want[a: b - 1] = row[a + 1: b]  # next token inside the document; -100 at its last token
        assert tgt.tolist() == want.tolist()


def test_next_token_with_batch_iterator():
    tok = CharTokenizer.from_corpus("abcdefgh ", family="gpt")
    obj = NextTokenPacking.from_tokenizer(tok, context=8)
    docs = [tok.encode(w) for w in ["ab", "cde", "fghabcdefgh", "a", "bb", "ccc"]]
    batch = next(iter(BatchIterator(obj.rows(docs), 2, seed=3, transform=obj)))
    assert sorted(batch) == ["document_ids", "inputs", "targets"]
    assert all(v.shape == (2, 8) for v in batch.values())
    with pytest.raises(ValueError, match="this objective expects 5"):
        NextTokenPacking(4, 0)(obj.rows(docs))
    with pytest.raises(ValueError, match="context must be"):
        NextTokenPacking(0, 0)
    bad = obj.rows(docs)
    bad["document_ids"] = bad["document_ids"][:, ::-1]
    with pytest.raises(ValueError, match="non-decreasing"):
        obj(bad)
    with pytest.raises(ValueError, match="missing \\['lengths'\\]"):
        obj({"tokens": bad["tokens"], "document_ids": bad["document_ids"]})


# --------------------------------------------------------------------------- MLM


@FAST
@given(LENGTHS, st.integers(3, 20), st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_mlm_never_masks_specials_and_wraps_each_document(lengths, length, packing, seed):
    tok = CharTokenizer(list("abcdefghij"), family="bert")
    obj = MLMPacking.from_tokenizer(tok, length, rate=0.3)
    rng = np.random.default_rng(seed)
    docs = [rng.integers(5, tok.vocab_size, n) for n in lengths]
    rows = obj.rows(docs, packing=packing)
    batch = obj(rows, seed)
    tokens, ids, used = rows["tokens"], rows["document_ids"], rows["lengths"]
    assert (batch["document_ids"] == ids).all()
    chosen = batch["targets"] != IGNORE_INDEX
    assert not (chosen & np.isin(tokens, [tok.pad_id, tok.cls_id, tok.sep_id])).any()
    assert (batch["targets"][chosen] == tokens[chosen]).all()
    assert (batch["inputs"][~chosen] == tokens[~chosen]).all()
    pieces = 0
    for row, ids_L, n in zip(tokens, ids, used):
        for a, b in runs(ids_L, n):
            assert row[a] == tok.cls_id and row[b - 1] == tok.sep_id and 3 <= b - a <= length
            assert not np.isin(row[a + 1: b - 1], tok.special_ids).any()
            pieces += 1
    assert pieces == sum(-(-n // (length - 2)) for n in lengths)
    check_ids(ids, used)


def test_mlm_config_errors():
    tok = CharTokenizer(list("abc"), family="bert")
    with pytest.raises(ValueError, match="length must be an int >= 3"):
        MLMPacking.from_tokenizer(tok, 2)
    with pytest.raises(ValueError, match="pad_id=0 must be one of special_ids"):
        MLMPacking(8, tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.vocab_size, (2, 3, 4))
    with pytest.raises(ValueError, match="rows have 6 tokens, this objective expects 8"):
        MLMPacking.from_tokenizer(tok, 8)(MLMPacking.from_tokenizer(tok, 6).rows([[5, 6]]), 0)


# --------------------------------------------------------------------------- span corruption


@FAST
@given(st.integers(1, 300), st.floats(0.05, 0.6), st.floats(1.0, 6.0), st.integers(0, 2 ** 32 - 1))
def test_span_lengths_are_what_corruption_produces(n, density, mean, seed):
    enc, dec, sentinels = span_lengths(n, density, mean)
    ex = t5_span_corruption(np.arange(10, 10 + n), seed, vocab_size=1000, eos_id=1, pad_id=0,
                            inputs_length=enc, targets_length=dec, noise_density=density,
                            mean_noise_span_length=mean)
    assert (ex["encoder_inputs"] != 0).sum() == enc and (ex["labels"] != IGNORE_INDEX).sum() == dec
    mask = random_spans_noise_mask(n, density, mean, seed)
    assert sentinels == max(int((mask[1:] & ~mask[:-1]).sum() + mask[0]), 1)


def test_span_raw_length_agrees_with_random_spans_helper():
    for s in (64, 128, 256):
        obj = SpanPacking(s, vocab_size=200, eos_id=1, pad_id=0)
        assert (obj.raw_length, obj.targets_length) == random_spans_helper(s)
    small = SpanPacking(4, vocab_size=200, eos_id=1, pad_id=0)  # the helper's 4 raw tokens do not fit
    assert all(e <= 4 and d <= small.targets_length
               for e, d, _ in (span_lengths(n, 0.15, 3.0) for n in range(1, small.raw_length + 1)))
    with pytest.raises(ValueError, match="targets_length must be an int >= 2"):
        SpanPacking(8, vocab_size=200, eos_id=1, pad_id=0, targets_length=1)
    with pytest.raises(ValueError, match="needs 4 sentinels, the tokenizer has 3"):
        SpanPacking(128, vocab_size=200, eos_id=1, pad_id=0, num_sentinels=3)


def uncorrupt(enc: np.ndarray, tgt: np.ndarray, vocab_size: int, num_sentinels: int) -> list[int]:
    """Put the noise spans of the targets back where the encoder has their sentinels."""
    assert enc[-1] == 1 and tgt[-1] == 1  # each part ends with its own EOS
    spans, current = {}, None
    for t in tgt[:-1].tolist():
        if t >= vocab_size - num_sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    return [x for t in enc[:-1].tolist() for x in spans.get(t, [t])]


@FAST
@given(st.lists(st.integers(0, 90), min_size=1, max_size=20).filter(any), st.sampled_from([16, 24, 40]),
       st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_span_corruption_per_document(lengths, inputs_length, packing, seed):
    v, k = 120, 20
    obj = SpanPacking(inputs_length, vocab_size=v, eos_id=1, pad_id=0, num_sentinels=k)
    rng = np.random.default_rng(seed)
    docs = [rng.integers(3, v - k, n) for n in lengths]
    rows = obj.rows(docs, packing=packing)
    batch = obj(rows, seed)
    s, t = inputs_length, obj.targets_length
    assert batch["enc_inputs"].shape == batch["enc_document_ids"].shape == (len(rows["lengths"]), s)
    assert batch["dec_inputs"].shape == batch["targets"].shape == batch["dec_document_ids"].shape == (len(rows["lengths"]), t)
    for r in range(len(rows["lengths"])):
        raw_runs = runs(rows["document_ids"][r], rows["lengths"][r])
        e_ids, d_ids = batch["enc_document_ids"][r], batch["dec_document_ids"][r]
        n_enc, n_dec = int((batch["enc_inputs"][r] != 0).sum()), int((batch["targets"][r] != IGNORE_INDEX).sum())
        e_runs, d_runs = runs(e_ids, n_enc), runs(d_ids, n_dec)
        assert len(e_runs) == len(d_runs) == len(raw_runs)  # both sides list the same documents
        for (a, b), (c, d), (x, y) in zip(e_runs, d_runs, raw_runs):
            enc, tgt, dec_in = batch["enc_inputs"][r, a:b], batch["targets"][r, c:d], batch["dec_inputs"][r, c:d]
            assert dec_in[0] == 0 and (dec_in[1:] == tgt[:-1]).all()  # shift right inside the document
            assert tgt[0] == v - 1  # sentinels restart at <extra_id_0> in every document
            assert uncorrupt(enc, tgt, v, k) == rows["tokens"][r, x:y].tolist()
        assert (batch["targets"][r, n_dec:] == IGNORE_INDEX).all() and (batch["dec_inputs"][r, n_dec:] == 0).all()
        check_ids(batch["enc_document_ids"][r: r + 1], [n_enc])
        check_ids(batch["dec_document_ids"][r: r + 1], [n_dec])
    if not packing:
        assert batch["enc_document_ids"].max() <= 1
    again = obj(rows, seed)
    assert all(np.array_equal(batch[key], again[key]) for key in batch)


def test_span_batches_from_batch_iterator_and_rows_from_another_config_refused():
    big = SpanPacking(64, vocab_size=120, eos_id=1, pad_id=0)
    rows = big.rows([np.arange(3, n) for n in range(4, 90, 7)])
    batch = next(iter(BatchIterator(rows, 3, seed=1, transform=big)))
    assert batch["enc_inputs"].shape == (3, 64) and batch["targets"].shape == (3, big.targets_length)
    with pytest.raises(ValueError, match="does not fit inputs_length=16"):
        SpanPacking(16, vocab_size=120, eos_id=1, pad_id=0)(rows, 0)


# --------------------------------------------------------------------------- report


TEXT = "\n\n".join(f"Speaker {i}:\n" + "word " * (3 + 7 * i % 40) for i in range(30))


def test_padding_report_packing_wastes_less(tmp_path, capsys):
    report = padding_report(TEXT, length=32)
    assert report["documents"] == 30 and report["length"] == 32
    for name, key in (("next_token", "padding_share"), ("mlm", "padding_share"),
                      ("span_corruption", "encoder_padding_share"), ("span_corruption", "decoder_padding_share")):
        packed, alone = report[name]["packed"], report[name]["one_per_row"]
        assert 0 <= packed[key] < alone[key] < 1 and packed["rows"] < alone["rows"]
    assert report["next_token"]["row_length"] == 33 and report["span_corruption"]["targets_length"] == 8
    (tmp_path / "corpus.txt").write_text(TEXT)
    main(["--corpus", str(tmp_path / "corpus.txt"), "--length", "32"])
    assert json.loads(capsys.readouterr().out) == {"corpus": str(tmp_path / "corpus.txt"), **report}
