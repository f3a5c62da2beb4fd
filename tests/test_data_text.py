"""Corpora, character tokenizer and byte-level BPE with BERT / GPT / T5 special tokens."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiment_scripts import SHARED_DATA
from local_http import Server
from txjax.data.text import (
    FAMILIES,
    BPETokenizer,
    CharTokenizer,
    load_corpus,
    load_tokenizer,
)

REAL_TINY = SHARED_DATA / "tinyshakespeare.txt"
SMALL = "hello world. the quick brown fox jumps over the lazy dog.\n" * 20


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    monkeypatch.delenv("TXJAX_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def corpus() -> str:
    return load_corpus()


@pytest.fixture(scope="module")
def bpe_t5(corpus) -> BPETokenizer:
    return BPETokenizer.train(corpus, vocab_size=600, family="t5", num_sentinels=10)


# --------------------------------------------------------------------------- corpora


def test_default_corpus_ships_with_package(corpus):
    assert 50_000 < len(corpus.encode()) < 300_000
    assert corpus.startswith("First Citizen:")
    assert load_corpus("default") == corpus == load_corpus(None)


def test_corpus_from_path_and_errors(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("abc\u00e9\n", encoding="utf-8")
    assert load_corpus(p) == load_corpus(str(p)) == "abc\u00e9\n"
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_corpus(tmp_path / "latin1.txt")
    with pytest.raises(FileNotFoundError, match="not one of the names"):
        load_corpus("tinyshakspeare")  # a typo is neither a name nor a file
    with pytest.raises(ValueError, match="folder"):
        load_corpus(tmp_path)


@pytest.mark.skipif(not REAL_TINY.is_file(), reason="shared data not beside the repo")
def test_tinyshakespeare_from_env(monkeypatch):
    monkeypatch.setenv("TXJAX_DATA", str(SHARED_DATA))
    text = load_corpus("tinyshakespeare", download=False)
    assert len(text.encode("utf-8")) == 1_115_394
    assert len(set(text)) == 65


def test_tinyshakespeare_download_local_server(tmp_path):
    body = b"ROMEO:\nBut soft!\n"
    digest = hashlib.sha256(body).hexdigest()
    cache = tmp_path / "cache"
    with Server({"/input.txt": body, "/bad.txt": body[:-3]}) as srv:
        # a truncated copy is refused and not kept; the next URL is tried
        text = load_corpus("tinyshakespeare", cache=cache, sha256=digest,
                           urls=(srv.url + "/bad.txt", srv.url + "/input.txt"))
        assert text == body.decode()
        assert sorted(p.name for p in cache.iterdir()) == ["tinyshakespeare.txt"]
        # second call reads the cache
        load_corpus("tinyshakespeare", cache=cache, sha256=digest, urls=(srv.url + "/input.txt",))
        assert srv.hits == ["/bad.txt", "/input.txt"]
        # a cached file with the wrong checksum is removed and fetched again
        (cache / "tinyshakespeare.txt").write_text("tampered")
        assert load_corpus("tinyshakespeare", cache=cache, sha256=digest,
                           urls=(srv.url + "/input.txt",)) == body.decode()


def test_tinyshakespeare_unreachable_fails_fast(tmp_path):
    with pytest.raises(FileNotFoundError, match="TXJAX_DATA"):
        load_corpus("tinyshakespeare", cache=tmp_path, urls=("http://127.0.0.1:9/x.txt",),
                    timeout=2.0)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- char


def test_char_layouts(corpus):
    chars = sorted(set(corpus))
    bert = CharTokenizer.from_corpus(corpus, "bert")
    assert (bert.pad_id, bert.unk_id, bert.cls_id, bert.sep_id, bert.mask_id) == (0, 1, 2, 3, 4)
    assert bert.vocab_size == 5 + len(chars) and bert.eot_id is None
    assert bert.encode(chars[0]).tolist() == [5]
    gpt = CharTokenizer.from_corpus(corpus, "gpt")
    assert gpt.eot_id == gpt.pad_id == 0 and gpt.vocab_size == 1 + len(chars)
    assert gpt.decode([0]) == "<|endoftext|>"
    t5 = CharTokenizer.from_corpus(corpus, "t5", num_sentinels=7)
    assert (t5.pad_id, t5.eos_id, t5.unk_id) == (0, 1, 2)
    assert t5.vocab_size == 3 + len(chars) + 7
    assert t5.sentinel_id(0) == t5.vocab_size - 1
    assert t5.sentinel_ids.tolist() == list(range(t5.vocab_size - 1, t5.vocab_size - 8, -1))
    assert t5.decode([t5.vocab_size - 1, t5.vocab_size - 7]) == "<extra_id_0><extra_id_6>"
    assert CharTokenizer.from_corpus(corpus, "t5").num_sentinels == 100
    plain = CharTokenizer.from_corpus(corpus)
    assert plain.pad_id is None and plain.vocab_size == len(chars)
    assert plain.special_ids.tolist() == []
    assert bert.special_ids.tolist() == [0, 1, 2, 3, 4]


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_char_round_trip(corpus, data):
    family = data.draw(st.sampled_from(list(FAMILIES)))
    tok = CharTokenizer.from_corpus(corpus, family)
    text = data.draw(st.text(alphabet=sorted(set(corpus)), max_size=200))
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and len(ids) == len(text)
    assert not np.isin(ids, tok.special_ids).any()
    assert tok.decode(ids) == text


def test_char_unknown_characters():
    tok = CharTokenizer.from_corpus("abc", "bert")
    with pytest.raises(ValueError, match=r"outside the vocabulary: \['x', 'é'\]"):
        tok.encode("abxcé")
    assert tok.encode("abx", unknown="unk").tolist() == [5, 6, 1]
    gpt = CharTokenizer.from_corpus("abc", "gpt")
    with pytest.raises(ValueError, match="no unknown token"):
        gpt.encode("x", unknown="unk")
    with pytest.raises(ValueError, match="empty corpus"):
        CharTokenizer.from_corpus("")
    with pytest.raises(ValueError, match="sentinels exist only"):
        CharTokenizer.from_corpus("abc", "bert", num_sentinels=3)
    with pytest.raises(ValueError, match="unknown family"):
        CharTokenizer.from_corpus("abc", "llama")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 7\]"):
        tok.decode([8])


def test_char_decode_skip_special():
    tok = CharTokenizer.from_corpus("ab", "t5", num_sentinels=2)
    ids = [tok.pad_id, 3, tok.sentinel_id(0), 4, tok.eos_id]
    assert tok.decode(ids) == "<pad>a<extra_id_0>b</s>"
    assert tok.decode(ids, skip_special=True) == "ab"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_char_save_load(tmp_path, corpus, family):
    tok = CharTokenizer.from_corpus(corpus, family)
    path = tok.save(tmp_path / "run" / "tokenizer.json")
    back = load_tokenizer(path)
    assert isinstance(back, CharTokenizer) and back.family == family
    assert back.vocab_size == tok.vocab_size and back.chars == tok.chars
    np.testing.assert_array_equal(back.encode(corpus[:500]), tok.encode(corpus[:500]))
    assert json.loads(path.read_text())["kind"] == "char"
    with pytest.raises(ValueError, match="not 'bpe'"):
        BPETokenizer.load(path)


def test_load_rejects_other_json(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a txjax tokenizer"):
        load_tokenizer(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizer JSON"):
        load_tokenizer(tmp_path / "y.json")


# --------------------------------------------------------------------------- BPE


def test_bpe_t5_layout(bpe_t5):
    tok = bpe_t5
    assert tok.vocab_size == 600
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
    assert tok.id_to_token(0) == "<pad>" and tok.id_to_token(2) == "<unk>"
    assert tok.id_to_token(599) == "<extra_id_0>" and tok.id_to_token(590) == "<extra_id_9>"
    assert tok.sentinel_ids.tolist() == list(range(599, 589, -1))
    assert tok.special_ids.tolist() == [0, 1, 2, *range(590, 600)]


@pytest.mark.parametrize("family, specials", [
    ("bert", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    ("gpt", ["<|endoftext|>"]),
    (None, []),
])
def test_bpe_front_specials(family, specials):
    tok = BPETokenizer.train(SMALL, vocab_size=300, family=family)
    assert [tok.id_to_token(i) for i in range(len(specials))] == specials
    assert tok.num_sentinels == 0
    ids = tok.encode("the lazy fox")
    assert not np.isin(ids, tok.special_ids).any()
    assert tok.decode(ids) == "the lazy fox"


# any code point but surrogates (built from integers: st.characters would first build
# hypothesis's Unicode table, several seconds on a fresh machine)
ANY_CHAR = st.one_of(
    st.sampled_from(list("the quick fox \n\t\r\x00é€😀")),
    st.integers(0, 0x10FFFF).filter(lambda c: not 0xD800 <= c <= 0xDFFF).map(chr),
)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=ANY_CHAR, max_size=120))
def test_bpe_round_trip_any_text(bpe_t5, text):
    ids = bpe_t5.encode(text)
    assert ids.dtype == np.int32
    assert bpe_t5.decode(ids) == text


def test_bpe_compresses_and_saves(tmp_path, corpus, bpe_t5):
    sample = corpus[:2000]
    ids = bpe_t5.encode(sample)
    assert len(ids) < 0.6 * len(sample.encode())  # merges were learned
    path = bpe_t5.save(tmp_path / "tok.json")
    back = load_tokenizer(path)
    assert isinstance(back, BPETokenizer) and back.vocab_size == 600 and back.family == "t5"
    np.testing.assert_array_equal(back.encode(sample), ids)
    assert back.sentinel_id(0) == 599
    assert [a.tolist() for a in back.encode_batch(["ab", "the"])] == \
        [back.encode("ab").tolist(), back.encode("the").tolist()]


def test_bpe_decode_specials(bpe_t5):
    ids = [bpe_t5.sentinel_id(0), *bpe_t5.encode("hi").tolist(), bpe_t5.eos_id]
    assert bpe_t5.decode(ids) == "<extra_id_0>hi</s>"
    assert bpe_t5.decode(ids, skip_special=True) == "hi"


def test_bpe_errors():
    with pytest.raises(ValueError, match="empty corpus"):
        BPETokenizer.train(["", "  "], vocab_size=300)
    with pytest.raises(ValueError, match="below 359"):
        BPETokenizer.train(SMALL, vocab_size=300, family="t5")  # 3 + 256 + 100 sentinels
    small = BPETokenizer.train("ab ab ab", vocab_size=5000, family="gpt")
    assert 257 <= small.vocab_size < 5000  # the corpus ran out of merges
