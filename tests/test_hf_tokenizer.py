"""txjax.hf.load_tokenizer: a folder's tokenizer.json or T5 spiece.model, against transformers.

Each tokenizer is trained here in a few milliseconds on a handful of sentences: a GPT-2 style
byte-level BPE and a BERT style WordPiece with `tokenizers`, a T5 unigram model with
`sentencepiece`. Ids and decoded text must equal transformers' for the same folder.
"""

import io
import json

import numpy as np
import pytest

from txjax import hf

tk = pytest.importorskip("tokenizers")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "A cat sat on the mat, and the dog sat on the rug.",
    "Thank you very much for the tea and the cake.", "Walking in the park is nice in the spring.",
    "Numbers like 42 and 1999 appear in text too!", "She sells sea shells by the sea shore.",
] * 3
TEXTS = ["The Fox sat in the park.", "Über café, zebra!  42", "the [MASK] sat", "", "  spaces   here  "]
T5_TEXTS = TEXTS + ["The <extra_id_0> walks in <extra_id_1> park", "</s> and <pad> typed", "end<extra_id_3>"]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def gpt2_style(folder):
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(SENTENCES, tk.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    return folder


def bert_style(folder, config: bool):
    tok = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    tok.decoder = tk.decoders.WordPiece()
    tok.train_from_iterator(SENTENCES, tk.trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=BERT_SPECIALS, show_progress=False))
    tok.post_processor = tk.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(str(folder / "tokenizer.json"))
    if config:  # [MASK] is also named by its old AddedToken form
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
             "mask_token": {"__type": "AddedToken", "content": "[MASK]", "lstrip": False, "rstrip": False}}))
    return folder


def t5_style(folder):
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES), model_writer=model, vocab_size=60, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2)
    (folder / "spiece.model").write_bytes(model.getvalue())
    return folder


@pytest.fixture
def folders(tmp_path):
    def make(kind):
        folder = tmp_path / kind
        folder.mkdir()
        return {"gpt2": gpt2_style, "bert": lambda f: bert_style(f, True),
                "bert_no_config": lambda f: bert_style(f, False), "t5": t5_style}[kind](folder)
    return make


# ----------------------------------------------------------------------------- without transformers


def test_byte_level_bpe_round_trips_any_text(folders):
    tok = hf.load_tokenizer(str(folders("gpt2")))
    assert isinstance(tok, hf.Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id, tok.mask_id) == (0, 0, 0, None, None)
    for text in TEXTS + ["emoji \U0001F600 and tabs\t\n"]:
        assert tok.decode(tok.encode(text)) == text
    with pytest.raises(ValueError, match="no pad token"):
        tok.encode_batch(["a"])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_bert_specials_default_to_transformers_names_and_batches_are_padded(folders):
    tok = hf.load_tokenizer(str(folders("bert_no_config")))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.eos_id) == (0, 1, 2, 3, 4, None)
    ids = tok.encode("the cat sat")
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert tok.encode("the cat sat", add_special_tokens=False) == ids[1:-1]
    assert tok.decode(ids, skip_special_tokens=True) == "the cat sat"
    batch = tok.encode_batch(["the cat sat on the mat", "the dog"])
    assert batch.dtype == np.int32 and batch.shape == (2, len(tok.encode("the cat sat on the mat")))
    assert list(batch[1]) == tok.encode("the dog") + [tok.pad_id] * (batch.shape[1] - len(tok.encode("the dog")))


def test_t5_spiece_has_sentinels_last_and_appends_eos(folders):
    tok = hf.load_tokenizer(str(folders("t5")))
    assert isinstance(tok, hf.Tokenizer)
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.unk_id, tok.bos_id) == (160, 0, 1, 2, None)
    assert (tok.token_to_id("<extra_id_0>"), tok.token_to_id("<extra_id_99>"), tok.id_to_token(159)) == (
        159, 60, "<extra_id_0>")
    ids = tok.encode("The fox <extra_id_0> park")
    assert ids[-1] == tok.eos_id and 159 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "The fox park"
    assert tok.decode(tok.encode("The cat sat on the mat."), skip_special_tokens=True) == "The cat sat on the mat."


def test_a_folder_without_a_tokenizer_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or spiece.model"):
        hf.load_tokenizer(str(tmp_path))


# ----------------------------------------------------------------------------- parity with transformers


def reference(kind, folder):
    transformers = pytest.importorskip("transformers")
    if kind == "t5":
        return transformers.T5Tokenizer.from_pretrained(str(folder))
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


@pytest.mark.parametrize("kind", ["gpt2", "bert", "bert_no_config", "t5"])
def test_ids_and_text_equal_transformers(kind, folders):
    folder = folders(kind)
    ref, tok = reference(kind, folder), hf.load_tokenizer(str(folder))
    assert tok.vocab_size == len(ref)
    for text in T5_TEXTS if kind == "t5" else TEXTS:
        ids = ref(text)["input_ids"]
        assert tok.encode(text) == ids, text
        assert tok.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"], text
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
    if kind != "bert_no_config":  # there transformers' generic class knows no special token at all
        for role in ("pad", "eos", "bos", "unk", "mask", "cls", "sep"):
            assert getattr(tok, f"{role}_id") == getattr(ref, f"{role}_token_id"), role


def test_auto_tokenizer_reads_the_same_ids(folders):
    transformers = pytest.importorskip("transformers")
    folder = folders("bert")
    ref, tok = transformers.AutoTokenizer.from_pretrained(str(folder)), hf.load_tokenizer(str(folder))
    assert [tok.encode(t) for t in TEXTS] == [ref(t)["input_ids"] for t in TEXTS]


def test_cli_tokenizes_text_with_a_t5_spiece_model(folders, capsys):
    from txjax import T5, T5Config
    from txjax.hf.cli import main

    folder = folders("t5")
    tok = hf.load_tokenizer(str(folder))
    hf.save_pretrained(T5(T5Config(vocab_size=tok.vocab_size, max_len=32, d_model=16, num_heads=2, num_layers=1,
                                   d_ff=32, attention_scale=1.0)), str(folder))
    assert main([str(folder), "--text", "The <extra_id_0> sat.", "--max-new-tokens", "2"]) == 0
    assert f"input  {tok.encode('The <extra_id_0> sat.')}" in capsys.readouterr().out
