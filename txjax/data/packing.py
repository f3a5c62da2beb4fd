"""Packed sequences: several documents per fixed-length row, told apart by per-token document ids.

Document ids (what the models' `document_ids_*` arguments read): int32, and in each row the
documents get 0, 1, 2, ... in order, each one contiguous run; the trailing padding gets the id
after the last document, so ids never decrease along a row. One document per row
(`packing=False`) uses the same format (0 for the document, 1 for its padding), so the two
modes mix in one batch. Attention never crosses documents and positions restart at each one.

Rows are dicts `{"tokens": [N, L], "document_ids": [N, L], "lengths": [N]}` (lengths: real
tokens per row; padding is told by them, never by `pad_id`, which may occur inside documents,
e.g. GPT's <|endoftext|>). `BatchIterator` batches such a dict per key, and the objectives
below are its transforms, `f(rows, rng) -> batch`:
- `NextTokenPacking`: {"inputs", "targets", "document_ids"}, targets -100 at padding and where
  the next token belongs to another document.
- `MLMPacking`: each document as [CLS] doc [SEP], then BERT masking over the packed row.
- `SpanPacking`: T5 span corruption of each document on its own (its own sentinels from
  <extra_id_0>, its own EOS, its decoder input starting with the start token), the
  (encoder, decoder) pairs packed jointly. Corrupted lengths depend only on raw lengths, so the
  packing is planned once from them and the corruption is drawn afresh for every batch.

Rows are filled by first fit: each document, in the given order, goes into the earliest row
with room (`txjax.data.bins.first_fit`, O(n log n)). Run
`python -m txjax.data.packing --corpus PATH [--length 128]` for the padding each objective
wastes with and without packing.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from txjax.data.bins import first_fit
from txjax.data.objectives import (
    IGNORE_INDEX,
    as_rng,
    mlm_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
)
from txjax.data.text import CharTokenizer, load_corpus

__all__ = [
    "MLMPacking",
    "NextTokenPacking",
    "SpanPacking",
    "pack_documents",
    "pack_rows",
    "padding_report",
    "padding_share",
    "span_lengths",
    "split_documents",
]


def split_documents(text: str) -> list[str]:
    """Paragraphs separated by one or more blank (or whitespace-only) lines, stripped, empties
    dropped. In tiny shakespeare each speech is one document."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _as_docs(docs: Sequence) -> list[np.ndarray]:
    """Validated int32 1-D documents, empty ones dropped."""
    if (isinstance(docs, np.ndarray) and docs.ndim != 2) or len(docs) == 0:
        raise ValueError("docs must be a non-empty sequence of 1-D token sequences")
    out = []
    for i, d in enumerate(docs):
        a = np.asarray(d)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"document {i} must be a 1-D sequence of int ids, got {a.dtype} {a.shape}")
        if a.size:
            out.append(a.astype(np.int32))
    if not out:
        raise ValueError(f"all {len(docs)} documents are empty")
    return out


def _chunks(docs: list[np.ndarray], size: int) -> list[np.ndarray]:
    """Each document cut into pieces of at most `size` tokens, in order."""
    return [d[i: i + size] for d in docs for i in range(0, d.size, size)]


def _check_length(name: str, value, least: int) -> None:
    if not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _fill(pieces: list[np.ndarray], rows: np.ndarray, length: int, pad_id: int
          ) -> dict[str, np.ndarray]:
    """Write pieces into their rows in order; the trailing padding gets the next document id."""
    n = int(rows.max()) + 1
    tokens_NL = np.full((n, length), pad_id, dtype=np.int32)
    ids_NL = np.zeros((n, length), dtype=np.int32)
    fill = np.zeros(n, dtype=np.int64)
    count = np.zeros(n, dtype=np.int32)
    for p, r in zip(pieces, rows.tolist()):
        tokens_NL[r, fill[r]: fill[r] + p.size] = p
        ids_NL[r, fill[r]: fill[r] + p.size] = count[r]
        fill[r] += p.size
        count[r] += 1
    ids_NL = np.where(np.arange(length) < fill[:, None], ids_NL, count[:, None])
    return {"tokens": tokens_NL, "document_ids": ids_NL.astype(np.int32), "lengths": fill.astype(np.int32)}


def pack_rows(docs: Sequence, length: int, pad_id: int, *, packing: bool = True
              ) -> dict[str, np.ndarray]:
    """Documents -> rows {"tokens", "document_ids": [N, length], "lengths": [N]}, int32.

    A document longer than `length` is cut into chunks of `length`, each then a document of its
    own. packing=True fills rows by `first_fit`; packing=False puts one chunk in each row.
    Empty documents are dropped.
    """
    _check_length("length", length, 1)
    pieces = _chunks(_as_docs(docs), int(length))
    sizes = np.array([p.size for p in pieces])
    rows = first_fit(sizes, [length]) if packing else np.arange(len(pieces))
    return _fill(pieces, rows, int(length), int(pad_id))


def pack_documents(docs: Sequence, length: int, pad_id: int, *, packing: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_NL, document_ids_NL), int32: `pack_rows` without the lengths."""
    rows = pack_rows(docs, length, pad_id, packing=packing)
    return rows["tokens"], rows["document_ids"]


def padding_share(tokens_NL: np.ndarray, pad_id: int, document_ids_NL: np.ndarray | None = None
                  ) -> float:
    """Share of tokens that are trailing padding: pad_id up to the end of a row (and, given
    document ids, inside the row's last run). Exact unless a document ends in pad_id."""
    tokens_NL = np.asarray(tokens_NL)
    if tokens_NL.ndim != 2 or tokens_NL.size == 0:
        raise ValueError(f"tokens must be a non-empty [N, L] array, got {tokens_NL.shape}")
    trailing = np.flip(np.cumprod(np.flip(tokens_NL == pad_id, 1), axis=1), 1).astype(bool)
    if document_ids_NL is not None:
        document_ids_NL = np.asarray(document_ids_NL)
        if document_ids_NL.shape != tokens_NL.shape:
            raise ValueError(f"document ids {document_ids_NL.shape} != tokens {tokens_NL.shape}")
        trailing &= document_ids_NL == document_ids_NL[:, -1:]
    return float(trailing.mean())


def _unpack(rows: Mapping[str, np.ndarray], width: int | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens_BL, document_ids_BL, lengths_B) of rows, checked (row length `width` if given)."""
    missing = {"tokens", "document_ids", "lengths"} - set(rows)
    if missing:
        raise ValueError(f"rows need keys tokens, document_ids, lengths; missing {sorted(missing)}")
    tokens, ids, lengths = (np.asarray(rows[k]) for k in ("tokens", "document_ids", "lengths"))
    if tokens.ndim != 2 or ids.shape != tokens.shape or lengths.shape != tokens.shape[:1]:
        raise ValueError(f"rows: tokens {tokens.shape}, document_ids {ids.shape}, lengths "
                         f"{lengths.shape} do not agree")
    if width is not None and tokens.shape[1] != width:
        raise ValueError(f"rows have {tokens.shape[1]} tokens, this objective expects {width}")
    if (np.diff(ids, axis=1) < 0).any():
        raise ValueError("document ids must be non-decreasing along each row")
    return tokens, ids, lengths


@dataclass(frozen=True)
class NextTokenPacking:
    """Next-token prediction on packed documents: rows of context + 1 tokens, shifted by one."""

    context: int  # T: model input length; rows hold context + 1 tokens
    pad_id: int  # written at padding
    eot_id: int | None = None  # appended to each document (GPT-2 practice: the model learns to end); None: nothing

    def __post_init__(self):
        _check_length("context", self.context, 1)

    @classmethod
    def from_tokenizer(cls, tok, context: int, *, end_with_eot: bool = True) -> NextTokenPacking:
        return cls(context, tok.pad_id, tok.eot_id if end_with_eot else None)

    def rows(self, docs: Sequence, *, packing: bool = True) -> dict[str, np.ndarray]:
        """Rows of context + 1 tokens (documents with eot_id appended, if set)."""
        docs = _as_docs(docs)
        if self.eot_id is not None:
            docs = [np.append(d, np.int32(self.eot_id)) for d in docs]
        return pack_rows(docs, self.context + 1, self.pad_id, packing=packing)

    def __call__(self, rows: Mapping[str, np.ndarray], rng=None) -> dict[str, np.ndarray]:
        """{"inputs", "targets", "document_ids"}: [B, context]; rng is unused (nothing is random)."""
        tokens_BL, ids_BL, lengths_B = _unpack(rows, self.context + 1)
        real_BT = np.arange(1, tokens_BL.shape[1]) < lengths_B[:, None]  # next token is not padding
        keep_BT = real_BT & (ids_BL[:, 1:] == ids_BL[:, :-1])  # ... and in the same document
        targets_BT = np.where(keep_BT, tokens_BL[:, 1:], IGNORE_INDEX).astype(np.int32)
        return {"inputs": tokens_BL[:, :-1], "targets": targets_BT, "document_ids": ids_BL[:, :-1]}


@dataclass(frozen=True)
class MLMPacking:
    """BERT MLM on packed documents, each [CLS] doc [SEP]; masking is per row, as `mlm_mask`."""

    length: int  # row length, [CLS] and [SEP] included
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]  # never chosen; must include pad, cls, sep and mask
    rate: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1

    def __post_init__(self):
        _check_length("length", self.length, 3)
        object.__setattr__(self, "special_ids", tuple(int(i) for i in self.special_ids))
        for name in ("pad_id", "cls_id", "sep_id", "mask_id"):
            if getattr(self, name) not in self.special_ids:
                raise ValueError(f"{name}={getattr(self, name)} must be one of special_ids")

    @classmethod
    def from_tokenizer(cls, tok, length: int, rate: float = 0.15) -> MLMPacking:
        return cls(length, tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.vocab_size,
                   tuple(tok.special_ids.tolist()), rate)

    def rows(self, docs: Sequence, *, packing: bool = True) -> dict[str, np.ndarray]:
        """Documents cut to length - 2, each chunk wrapped as [CLS] chunk [SEP], then packed."""
        cls_, sep = np.int32([self.cls_id]), np.int32([self.sep_id])
        pieces = [np.concatenate([cls_, c, sep]) for c in _chunks(_as_docs(docs), self.length - 2)]
        return pack_rows(pieces, self.length, self.pad_id, packing=packing)

    def __call__(self, rows: Mapping[str, np.ndarray], rng) -> dict[str, np.ndarray]:
        """{"inputs", "targets", "document_ids"}: [B, length], targets -100 except at chosen tokens."""
        tokens_BL, ids_BL, _ = _unpack(rows, self.length)
        inputs_BL, targets_BL = mlm_mask(tokens_BL, rng, mask_id=self.mask_id, vocab_size=self.vocab_size,
                                         special_ids=self.special_ids, rate=self.rate,
                                         mask_prob=self.mask_prob, random_prob=self.random_prob)
        return {"inputs": inputs_BL, "targets": targets_BL, "document_ids": ids_BL}


def span_lengths(n: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int, int]:
    """(encoder, decoder, sentinels) lengths of `n` raw tokens after T5 span corruption, EOS
    included: what `random_spans_noise_mask` draws, whose counts depend on n alone."""
    if n == 1:  # no noise: encoder [tok, EOS], decoder [<extra_id_0>, EOS]
        return 2, 2, 1
    noise = min(max(int(np.round(n * noise_density)), 1), n - 1)
    spans = min(max(int(np.round(noise / mean_noise_span_length)), 1), noise, n - noise)
    return n - noise + spans + 1, noise + spans + 1, spans


@dataclass(frozen=True)
class SpanPacking:
    """T5 span corruption on packed documents: encoder rows of inputs_length, decoder rows of
    targets_length (default: `random_spans_helper`'s), each document corrupted on its own.

    Rows hold the raw chunks (width inputs_length + targets_length, enough for any row that
    fits) packed by the corrupted (encoder, decoder) sizes, which are fixed by raw lengths;
    a document goes into a row only if both parts fit. The transform draws the noise afresh.
    """

    inputs_length: int  # S
    vocab_size: int
    eos_id: int
    pad_id: int  # padding, and T5's decoder start token
    targets_length: int | None = None  # T; None: random_spans_helper(inputs_length, ...)[1]
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    num_sentinels: int | None = None  # if given, a chunk needing more sentinels is an error
    raw_length: int = field(init=False)  # longest chunk: every length up to it fits S and T

    def __post_init__(self):
        _check_length("inputs_length", self.inputs_length, 2)
        if self.targets_length is None:
            object.__setattr__(self, "targets_length", random_spans_helper(
                self.inputs_length, self.noise_density, self.mean_noise_span_length)[1])
        _check_length("targets_length", self.targets_length, 2)
        if not 0.0 < self.noise_density < 1.0 or self.mean_noise_span_length <= 0:
            raise ValueError("noise_density must be in (0, 1) and mean_noise_span_length > 0")
        n = 0  # ends >= 1: one token corrupts to 2 + 2, and both lengths are >= 2
        while n < self.inputs_length + self.targets_length and self._fits(n + 1):
            n += 1
        object.__setattr__(self, "raw_length", n)

    def _fits(self, n: int) -> bool:
        e, d, k = span_lengths(n, self.noise_density, self.mean_noise_span_length)
        if self.num_sentinels is not None and k > self.num_sentinels:
            raise ValueError(f"a chunk of {n} tokens needs {k} sentinels, the tokenizer has "
                             f"{self.num_sentinels}")
        return e <= self.inputs_length and d <= self.targets_length

    @classmethod
    def from_tokenizer(cls, tok, inputs_length: int, targets_length: int | None = None,
                       noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> SpanPacking:
        return cls(inputs_length, tok.vocab_size, tok.eos_id, tok.pad_id, targets_length,
                   noise_density, mean_noise_span_length, tok.num_sentinels)

    def rows(self, docs: Sequence, *, packing: bool = True) -> dict[str, np.ndarray]:
        """Raw chunks of at most raw_length tokens, packed by their corrupted sizes."""
        pieces = _chunks(_as_docs(docs), self.raw_length)
        sizes = np.array([span_lengths(p.size, self.noise_density, self.mean_noise_span_length)[:2]
                          for p in pieces])
        rows = (first_fit(sizes, [self.inputs_length, self.targets_length]) if packing
                else np.arange(len(pieces)))
        return _fill(pieces, rows, self.inputs_length + self.targets_length, self.pad_id)

    def __call__(self, rows: Mapping[str, np.ndarray], rng) -> dict[str, np.ndarray]:
        """{"enc_inputs", "enc_document_ids": [B, S], "dec_inputs", "targets", "dec_document_ids":
        [B, T]}: per document, corrupted tokens + EOS; targets sentinel/noise + EOS (-100 at
        padding); decoder inputs the targets shifted right within the document, from pad_id."""
        rng = as_rng(rng)
        tokens_BL, ids_BL, lengths_B = _unpack(rows)
        b, s, t = tokens_BL.shape[0], self.inputs_length, self.targets_length
        enc_BS, dec_in_BT = np.full((b, s), self.pad_id, np.int32), np.full((b, t), self.pad_id, np.int32)
        targets_BT = np.full((b, t), IGNORE_INDEX, np.int32)
        enc_ids_BS, dec_ids_BT = np.zeros((b, s), np.int32), np.zeros((b, t), np.int32)
        for r in range(b):
            row_ids, row_tokens = ids_BL[r, : lengths_B[r]], tokens_BL[r, : lengths_B[r]]
            starts = np.flatnonzero(row_ids[1:] != row_ids[:-1]) + 1
            e = d = k = 0
            for k, doc in enumerate(np.split(row_tokens, starts) if row_tokens.size else []):
                noise = random_spans_noise_mask(doc.size, self.noise_density,
                                                self.mean_noise_span_length, rng)
                x = np.append(noise_span_to_unique_sentinel(doc, noise, self.vocab_size), self.eos_id)
                y = np.append(nonnoise_span_to_unique_sentinel(doc, noise, self.vocab_size), self.eos_id)
                if e + x.size > s or d + y.size > t:
                    raise ValueError(f"row {r} does not fit inputs_length={s} / targets_length={t} "
                                     "after corruption (build rows with this config's rows())")
                enc_BS[r, e: e + x.size], enc_ids_BS[r, e: e + x.size] = x, k
                targets_BT[r, d: d + y.size], dec_ids_BT[r, d: d + y.size] = y, k
                dec_in_BT[r, d + 1: d + y.size] = y[:-1]  # dec_in_BT[r, d] stays pad_id: the start token
                e, d = e + x.size, d + y.size
            n_docs = k + 1 if row_tokens.size else 0
            enc_ids_BS[r, e:], dec_ids_BT[r, d:] = n_docs, n_docs
        return {"enc_inputs": enc_BS, "dec_inputs": dec_in_BT, "targets": targets_BT,
                "enc_document_ids": enc_ids_BS, "dec_document_ids": dec_ids_BT}


def padding_report(text: str, length: int = 128) -> dict:
    """Share of padding tokens per objective, packed vs one (chunk of a) document per row, on
    `split_documents(text)`, with the family's char tokenizer: next-token (GPT, rows of
    length + 1 with <|endoftext|> after each document), MLM (BERT, rows of length), span
    corruption (T5, encoder rows of length, decoder rows from random_spans_helper)."""
    docs = split_documents(text)
    if not docs:
        raise ValueError("the text has no documents")
    out: dict = {"documents": len(docs), "length": int(length)}
    for name, family in (("next_token", "gpt"), ("mlm", "bert"), ("span_corruption", "t5")):
        tok = CharTokenizer.from_corpus(text, family=family)
        ids = [tok.encode(d) for d in docs]
        obj = {"gpt": NextTokenPacking, "bert": MLMPacking, "t5": SpanPacking}[family].from_tokenizer(tok, length)
        entry: dict = ({"inputs_length": obj.inputs_length, "targets_length": obj.targets_length,
                        "raw_length": obj.raw_length} if family == "t5" else {})
        for mode, packing in (("packed", True), ("one_per_row", False)):
            rows = obj.rows(ids, packing=packing)
            width = rows["tokens"].shape[1]
            n_docs = rows["document_ids"][:, -1] + (rows["lengths"] == width)
            stats: dict = {"rows": len(n_docs), "documents_per_row": float(n_docs.mean())}
            if family == "t5":
                batch = obj(rows, np.random.default_rng(0))
                stats["encoder_padding_share"] = padding_share(batch["enc_inputs"], tok.pad_id,
                                                               batch["enc_document_ids"])
                stats["decoder_padding_share"] = float((batch["targets"] == IGNORE_INDEX).mean())
            else:
                entry["row_length"] = int(width)
                stats["padding_share"] = float(1.0 - rows["lengths"].sum() / rows["tokens"].size)
            entry[mode] = stats
        out[name] = entry
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: print `padding_report` of a corpus as JSON."""
    p = argparse.ArgumentParser(prog="python -m txjax.data.packing", description=padding_report.__doc__)
    p.add_argument("--corpus", required=True, help="a UTF-8 file or a txjax.data corpus name")
    p.add_argument("--length", type=int, default=128, help="row length (T5: encoder length)")
    a = p.parse_args(argv)
    print(json.dumps({"corpus": a.corpus, **padding_report(load_corpus(a.corpus), a.length)}, indent=2))


if __name__ == "__main__":
    main()
