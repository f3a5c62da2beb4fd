"""Text tokenizers: a character tokenizer and a byte-level BPE tokenizer, with per-family specials.


Special-token layouts (`FAMILIES`), ordinary tokens following the leading specials:
- `"bert"`: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
- `"gpt"`: <|endoftext|>=0. GPT has no padding token; `pad_id` is <|endoftext|>, as
  Hugging Face does, so padding masks for GPT must come from lengths, not ids.
- `"t5"`: <pad>=0 </s>=1 <unk>=2, and K sentinels at the END of the vocabulary,
  `<extra_id_k>` = vocab_size - 1 - k, so <extra_id_0> is the last id (T5's convention).
- `None`: no specials at all (nanoGPT's 65-character Shakespeare vocabulary).

`encode` never adds specials (objectives and batching add BOS/EOS/CLS where they belong)
and returns an int32 NumPy array. Tokenizers save to and load from one JSON file.
"""


from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "DEFAULT_T5_SENTINELS",
    "FAMILIES",
    "load_tokenizer",
    "sentinel_token",
]

# --------------------------------------------------------------------------- specials

FAMILIES: dict[str | None, tuple[str, ...]] = {
    "bert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "gpt": ("<|endoftext|>",),
    "t5": ("<pad>", "</s>", "<unk>"),
    None: (),
}
"""Leading special tokens of each family, in id order from 0."""

_ROLES = {  # attribute name -> special token string, per family
    "bert": {"pad_id": "[PAD]", "unk_id": "[UNK]", "cls_id": "[CLS]", "sep_id": "[SEP]",
             "mask_id": "[MASK]"},
    "gpt": {"pad_id": "<|endoftext|>", "eot_id": "<|endoftext|>", "eos_id": "<|endoftext|>"},
    "t5": {"pad_id": "<pad>", "eos_id": "</s>", "unk_id": "<unk>"},
    None: {},
}
_ROLE_NAMES = ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id", "eot_id", "eos_id")
DEFAULT_T5_SENTINELS = 100


def _check_family(family: str | None, num_sentinels: int | None) -> int:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {list(FAMILIES)}")
    if num_sentinels is None:
        return DEFAULT_T5_SENTINELS if family == "t5" else 0
    if num_sentinels < 0 or (num_sentinels and family != "t5"):
        raise ValueError(f"num_sentinels={num_sentinels}: sentinels exist only for family 't5'")
    return int(num_sentinels)


def sentinel_token(k: int) -> str:
    """The string of T5 sentinel k."""
    return f"<extra_id_{k}>"


class _Specials:
    """Shared attributes: ids of the family's special tokens, sentinels, vocabulary size.

    Attributes absent from a family (e.g. `mask_id` for GPT) are None.
    """

    family: str | None
    num_sentinels: int
    vocab_size: int
    pad_id: int | None
    unk_id: int | None
    cls_id: int | None
    sep_id: int | None
    mask_id: int | None
    eot_id: int | None
    eos_id: int | None

    def _set_roles(self) -> None:
        front = FAMILIES[self.family]
        for role in _ROLE_NAMES:
            tok = _ROLES[self.family].get(role)
            setattr(self, role, None if tok is None else front.index(tok))

    @property
    def num_leading_specials(self) -> int:
        """How many special tokens precede the ordinary ones."""
        return len(FAMILIES[self.family])

    def sentinel_id(self, k: int) -> int:
        """Id of `<extra_id_k>`: vocab_size - 1 - k (T5 family only)."""
        if not 0 <= k < self.num_sentinels:
            raise ValueError(f"sentinel {k} out of range (this tokenizer has {self.num_sentinels})")
        return self.vocab_size - 1 - k

    @property
    def sentinel_ids(self) -> np.ndarray:
        """Ids of <extra_id_0>, <extra_id_1>, ... (descending from vocab_size - 1)."""
        return self.vocab_size - 1 - np.arange(self.num_sentinels, dtype=np.int32)

    @property
    def special_ids(self) -> np.ndarray:
        """All special ids (leading specials and sentinels), sorted; MLM never picks these."""
        lead = np.arange(self.num_leading_specials, dtype=np.int32)
        return np.sort(np.concatenate([lead, self.sentinel_ids])).astype(np.int32)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token string -> id."""
        out = {t: i for i, t in enumerate(FAMILIES[self.family])}
        out.update({sentinel_token(k): self.vocab_size - 1 - k for k in range(self.num_sentinels)})
        return out


def _write_json(path: str | os.PathLike, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def _read_json(path: str | os.PathLike, kind: str | None) -> dict:
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a tokenizer JSON file ({e})") from e
    if not isinstance(payload, dict) or payload.get("format") != "txjax-tokenizer":
        raise ValueError(f"{path}: not a txjax tokenizer file")
    if kind is not None and payload.get("kind") != kind:
        raise ValueError(f"{path}: holds a {payload.get('kind')!r} tokenizer, not {kind!r}")
    return payload


# --------------------------------------------------------------------------- char


class CharTokenizer(_Specials):
    """Character-level tokenizer: the family's specials, the corpus's characters in sorted
    order, then (T5) the sentinels.

    Characters outside the vocabulary raise ValueError unless `unknown="unk"` is passed
    to `encode` and the family has an unknown token (bert, t5).
    """

    def __init__(self, chars: Sequence[str], family: str | None = None,
                 num_sentinels: int | None = None):
        self.family = family
        self.num_sentinels = _check_family(family, num_sentinels)
        chars = list(chars)
        if not chars:
            raise ValueError("a character vocabulary needs at least one character")
        single = all(isinstance(c, str) and len(c) == 1 for c in chars)
        if not single or len(set(chars)) != len(chars):
            raise ValueError("chars must be distinct single characters")
        self.chars: tuple[str, ...] = tuple(chars)
        n_front = len(FAMILIES[family])
        self.vocab_size = n_front + len(chars) + self.num_sentinels
        self._set_roles()
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        order = np.argsort(codes)
        self._codes_sorted = codes[order]
        self._ids_sorted = (order + n_front).astype(np.int32)
        self._id_to_str = list(FAMILIES[family]) + list(chars) + [
            sentinel_token(k) for k in reversed(range(self.num_sentinels))]

    @classmethod
    def from_corpus(cls, text: str, family: str | None = None,
                    num_sentinels: int | None = None) -> "CharTokenizer":
        """Vocabulary = the sorted distinct characters of `text` (which must not be empty)."""
        if not isinstance(text, str) or not text:
            raise ValueError("cannot build a character vocabulary from an empty corpus")
        return cls(sorted(set(text)), family=family, num_sentinels=num_sentinels)

    def encode(self, text: str, unknown: str = "error") -> np.ndarray:
        """text -> int32 ids `[len(text)]`; `unknown` is "error" or "unk"."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        if unknown not in ("error", "unk"):
            raise ValueError(f"unknown must be 'error' or 'unk', got {unknown!r}")
        if unknown == "unk" and self.unk_id is None:
            raise ValueError(f"family {self.family!r} has no unknown token; use unknown='error'")
        utf32 = text.encode("utf-32-le", "surrogatepass")
        codes = np.frombuffer(utf32, dtype="<u4").astype(np.int64)
        pos = np.minimum(np.searchsorted(self._codes_sorted, codes), len(self._codes_sorted) - 1)
        known = self._codes_sorted[pos] == codes
        ids = self._ids_sorted[pos]
        if not known.all():
            if unknown == "unk":
                ids = np.where(known, ids, self.unk_id)
            else:
                where = np.flatnonzero(~known)
                bad = sorted({text[i] for i in where[:1000].tolist()})
                hint = ("" if self.unk_id is None
                        else " (unknown='unk' maps them to the unknown token)")
                raise ValueError(f"characters outside the vocabulary: {bad!r} "
                                 f"({where.size} in all, first at position {int(where[0])}){hint}")
        return ids.astype(np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray, skip_special: bool = False) -> str:
        """ids -> text; specials appear as their strings unless `skip_special`."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.vocab_size - 1}]")
        n_front, n_chars = self.num_leading_specials, len(self.chars)
        if skip_special:
            ids = ids[(ids >= n_front) & (ids < n_front + n_chars)]
        table = self._id_to_str
        return "".join(table[i] for i in ids.tolist())

    def id_to_token(self, i: int) -> str:
        """The string of one id."""
        return self._id_to_str[int(i)]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary and family to a JSON file."""
        return _write_json(path, {"format": "txjax-tokenizer", "version": 1, "kind": "char",
                                  "family": self.family, "num_sentinels": self.num_sentinels,
                                  "chars": list(self.chars)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CharTokenizer":
        """Read a tokenizer written by `save`."""
        p = _read_json(path, "char")
        return cls(p["chars"], family=p["family"], num_sentinels=p["num_sentinels"])

    def __repr__(self) -> str:
        return (f"CharTokenizer(family={self.family!r}, chars={len(self.chars)}, "
                f"vocab_size={self.vocab_size})")


# --------------------------------------------------------------------------- BPE


def _hf():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("BPETokenizer needs the `tokenizers` package "
                          "(pip install tokenizers)") from e
    return tokenizers


class BPETokenizer(_Specials):
    """Byte-level BPE (GPT-2 style) trained with Hugging Face `tokenizers`.

    Ids: the family's specials from 0, the 256 byte symbols and learned merges, then
    (T5) the sentinels with <extra_id_0> last. Any text round-trips exactly, so there is
    no unknown token in practice. `vocab_size` in `train` is an upper bound: a small
    corpus may run out of merges first; read `.vocab_size` for the real size.
    Special-token strings written literally in the text (e.g. "[MASK]") encode to their
    special id, as in Hugging Face.
    """

    def __init__(self, hf_tokenizer, family: str | None = None, num_sentinels: int | None = None):
        self.family = family
        self.num_sentinels = _check_family(family, num_sentinels)
        self._tok = hf_tokenizer
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self._set_roles()
        for tok, i in self.special_tokens.items():
            if hf_tokenizer.token_to_id(tok) != i:
                raise ValueError(f"tokenizer has {tok!r} at id {hf_tokenizer.token_to_id(tok)}, "
                                 f"expected {i} for family {family!r}")

    @classmethod
    def train(cls, text: str | Iterable[str], vocab_size: int, family: str | None = None,
              num_sentinels: int | None = None, min_frequency: int = 2) -> "BPETokenizer":
        """Train on `text` (a string or an iterable of strings) up to `vocab_size` ids in all."""
        tk = _hf()
        k = _check_family(family, num_sentinels)
        front = list(FAMILIES[family])
        texts = [text] if isinstance(text, str) else list(text)
        if not any(t.strip() for t in texts):
            raise ValueError("cannot train BPE on an empty corpus")
        alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
        floor = len(front) + len(alphabet) + k
        if vocab_size < floor:
            raise ValueError(f"vocab_size {vocab_size} is below {floor} = specials "
                             f"({len(front)}) + 256 byte symbols + sentinels ({k})")
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size - k, min_frequency=min_frequency, special_tokens=front,
            initial_alphabet=alphabet, show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        if k:
            # added tokens take the next free ids, so add <extra_id_{k-1}> first and
            # <extra_id_0> last: it becomes vocab_size - 1.
            tok.add_special_tokens([tk.AddedToken(sentinel_token(j), special=True, normalized=False)
                                    for j in reversed(range(k))])
        return cls(tok, family=family, num_sentinels=k)

    def encode(self, text: str) -> np.ndarray:
        """text -> int32 ids (no specials added)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Many texts at once (parallel in Rust)."""
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids: Iterable[int] | np.ndarray, skip_special: bool = False) -> str:
        """ids -> text; specials appear as their strings unless `skip_special`."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.vocab_size - 1}]")
        return self._tok.decode(ids.tolist(), skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str:
        """The (byte-level) string of one id."""
        return self._tok.id_to_token(int(i))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the Hugging Face tokenizer and the family to one JSON file."""
        return _write_json(path, {"format": "txjax-tokenizer", "version": 1, "kind": "bpe",
                                  "family": self.family, "num_sentinels": self.num_sentinels,
                                  "tokenizer": json.loads(self._tok.to_str())})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BPETokenizer":
        """Read a tokenizer written by `save`."""
        p = _read_json(path, "bpe")
        tok = _hf().Tokenizer.from_str(json.dumps(p["tokenizer"]))
        return cls(tok, family=p["family"], num_sentinels=p["num_sentinels"])

    def __repr__(self) -> str:
        return f"BPETokenizer(family={self.family!r}, vocab_size={self.vocab_size})"


def load_tokenizer(path: str | os.PathLike) -> CharTokenizer | BPETokenizer:
    """Load whichever tokenizer a `save` call wrote to `path`."""
    kind = _read_json(path, None).get("kind")
    if kind == "char":
        return CharTokenizer.load(path)
    if kind == "bpe":
        return BPETokenizer.load(path)
    raise ValueError(f"{path}: unknown tokenizer kind {kind!r}")
