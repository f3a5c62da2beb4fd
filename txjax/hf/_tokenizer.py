"""The tokenizer of a local Hugging Face folder: tokenizer.json (`tokenizers`) or spiece.model (`sentencepiece`).

    tok = txjax.hf.load_tokenizer("path/to/folder")
    ids = tok.encode("Hello world")            # with the specials transformers adds: [CLS] ... [SEP], ... </s>
    tok.decode(ids, skip_special_tokens=True)  # "hello world"
    tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id  # None where absent

Ids and text are what transformers gives for the same folder (`AutoTokenizer` for tokenizer.json,
`T5Tokenizer` for a T5 folder that ships only spiece.model). The special tokens are the ones
tokenizer_config.json (or special_tokens_map.json) names; where it names none, the strings
transformers' BERT, GPT-2 and T5 classes assume ([PAD], <pad>, </s>, <|endoftext|>, ...).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

TOKENIZER_JSON = "tokenizer.json"
SPIECE = "spiece.model"
ROLES = ("pad", "eos", "bos", "unk", "mask", "cls", "sep")
# What transformers' BertTokenizer, GPT2Tokenizer and T5Tokenizer assume when the folder names nothing.
_DEFAULTS = {
    "pad": ("[PAD]", "<pad>"), "eos": ("</s>", "<|endoftext|>"), "bos": ("<s>", "<|endoftext|>"),
    "unk": ("[UNK]", "<unk>", "<|endoftext|>"), "mask": ("[MASK]", "<mask>"), "cls": ("[CLS]",), "sep": ("[SEP]",),
}
T5_EXTRA_IDS = 100  # T5Tokenizer's default number of sentinels <extra_id_k>


def _folder_config(path: str) -> dict:
    """tokenizer_config.json over special_tokens_map.json, where the folder has them."""
    out: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                out.update(json.load(f))
    return out


def _token_name(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """encode(text) -> ids and decode(ids) -> text, as transformers does, and the special ids."""

    vocab_size: int
    pad_id: int | None
    eos_id: int | None
    bos_id: int | None
    unk_id: int | None
    mask_id: int | None
    cls_id: int | None
    sep_id: int | None

    def _set_specials(self, config: dict, own: dict[str, int] | None = None) -> None:
        """Each role's id: the token the folder's config names, else the backend's own, else a default string."""
        for role in ROLES:
            named = _token_name(config.get(f"{role}_token"))
            if named is not None:
                found = self.token_to_id(named)
            elif own and role in own:
                found = own[role]
            else:
                found = next((i for t in _DEFAULTS[role] if (i := self.token_to_id(t)) is not None), None)
            setattr(self, f"{role}_id", found)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """text -> ids; add_special_tokens: the ones transformers adds ([CLS] ... [SEP] for BERT, </s> for T5)."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """ids -> text; special tokens are written as their strings unless skip_special_tokens."""
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    def id_to_token(self, i: int) -> str | None:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> np.ndarray:
        """int32 [B, T]: each text's ids, right-padded with pad_id to the longest."""
        if self.pad_id is None:
            raise ValueError("this tokenizer has no pad token; encode the texts one by one")
        rows = [self.encode(t, add_special_tokens) for t in texts]
        out = np.full((len(rows), max((len(r) for r in rows), default=0)), self.pad_id, np.int32)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        return out

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), np.int64).reshape(-1).tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return ids

    def __repr__(self) -> str:
        ids = {r: getattr(self, f"{r}_id") for r in ROLES}
        specials = ", ".join(f"{r}_id={i}" for r, i in ids.items() if i is not None)
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, {specials})"


class JsonTokenizer(Tokenizer):
    """A tokenizer.json, run by Hugging Face `tokenizers` (the library behind transformers' fast tokenizers)."""

    def __init__(self, file: str, config: dict | None = None):
        from tokenizers import Tokenizer as _Tokenizer

        self._tok = _Tokenizer.from_file(file)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._set_specials(config or {})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))


class SentencePieceTokenizer(Tokenizer):
    """A T5 spiece.model, run by `sentencepiece`, with T5Tokenizer's conventions: `extra_ids` sentinels
    after the pieces (<extra_id_0> is the last id), </s> appended, special strings in the text kept whole."""

    def __init__(self, file: str, config: dict | None = None):
        try:
            import sentencepiece
        except ImportError as err:
            raise ImportError(f"{file} needs `sentencepiece` (pip install 'txjax[hf]')") from err
        config = config or {}
        self._sp = sentencepiece.SentencePieceProcessor(model_file=file)
        self._pieces = self._sp.get_piece_size()
        self.extra_ids = int(config.get("extra_ids", T5_EXTRA_IDS))
        self.vocab_size = self._pieces + self.extra_ids
        own = {role: i for role, i in (("pad", self._sp.pad_id()), ("eos", self._sp.eos_id()),
                                       ("bos", self._sp.bos_id()), ("unk", self._sp.unk_id())) if i >= 0}
        self._set_specials(config, own)
        # Written as strings in decoded text and kept whole when encoding: control pieces, unk, sentinels.
        self._special_ids = {i for i in range(self._pieces) if self._sp.is_control(i) or self._sp.is_unknown(i)}
        self._special_ids |= set(range(self._pieces, self.vocab_size))
        self._special_ids |= {i for i in (self.pad_id, self.eos_id, self.unk_id) if i is not None}
        strings = sorted((self.id_to_token(i) for i in self._special_ids), key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, strings)) + ")") if strings else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids: list[int] = []
        for k, chunk in enumerate(self._split.split(text) if self._split else [text]):
            if k % 2:  # a special token's string
                ids.append(self.token_to_id(chunk))
            elif chunk:
                ids += self._sp.encode(chunk)
        if add_special_tokens and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ordinary pieces through sentencepiece; a run after a special token keeps its leading space."""
        out, run = [], []

        def flush():
            if run:
                text = self._sp.decode(run)
                starts_word = self._sp.id_to_piece(run[0]).startswith("\u2581")
                out.append(" " + text if out and starts_word else text)
                run.clear()

        for i in self._check_ids(ids):
            if i not in self._special_ids:
                run.append(i)
            elif not skip_special_tokens:
                flush()
                out.append(self.id_to_token(i))
        flush()
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        m = re.fullmatch(r"<extra_id_(\d+)>", token)
        if m and int(m.group(1)) < self.extra_ids:
            return self.vocab_size - 1 - int(m.group(1))
        i = self._sp.piece_to_id(token)
        return i if i != self._sp.unk_id() or token == self._sp.id_to_piece(i) else None

    def id_to_token(self, i: int) -> str | None:
        i = int(i)
        if self._pieces <= i < self.vocab_size:
            return f"<extra_id_{self.vocab_size - 1 - i}>"
        return self._sp.id_to_piece(i) if 0 <= i < self._pieces else None


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of a local Hugging Face folder: its tokenizer.json, else its spiece.model (T5)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a folder (txjax.hf reads local Hugging Face folders)")
    config = _folder_config(path)
    if os.path.isfile(os.path.join(path, TOKENIZER_JSON)):
        return JsonTokenizer(os.path.join(path, TOKENIZER_JSON), config)
    if os.path.isfile(os.path.join(path, SPIECE)):
        return SentencePieceTokenizer(os.path.join(path, SPIECE), config)
    raise FileNotFoundError(f"{path} has no {TOKENIZER_JSON} or {SPIECE}")
