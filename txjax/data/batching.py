"""Fixed-shape NumPy batches: padding, packing, and a seeded, resumable batch iterator.

Fixed shapes matter because a jitted step recompiles for every new shape. The iterator's
whole position is `(epoch, step)`: the order of epoch e is a permutation drawn from
`(seed, e)` alone, and the per-batch randomness handed to `transform` (MLM masking, span
corruption) from `(seed, e, step)` alone, so restoring a saved state replays exactly the
same stream with no hidden generator state to checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "BatchIterator",
    "IteratorState",
    "concat_documents",
    "nonpad_mask",
    "pack_tokens",
    "pad_batch",
]


def pad_batch(sequences: Sequence[Sequence[int] | np.ndarray], length: int, pad_id: int,
              *, truncate: bool = False) -> np.ndarray:
    """Right-pad 1-D token sequences with `pad_id` into int32 `[B, length]`.

    A sequence longer than `length` is an error unless `truncate=True` (then it is cut).
    """
    out = np.full((len(sequences), length), pad_id, dtype=np.int32)
    for i, seq in enumerate(sequences):
        seq = np.asarray(seq).reshape(-1)
        if seq.size > length:
            if not truncate:
                raise ValueError(f"sequence {i} has {seq.size} tokens, more than length={length} "
                                 "(pass truncate=True to cut it)")
            seq = seq[:length]
        out[i, : seq.size] = seq
    return out


def nonpad_mask(tokens_BT: np.ndarray, pad_id: int) -> np.ndarray:
    """bool `[B, T]`: True at real tokens, False at padding (`tokens == pad_id`)."""
    return np.asarray(tokens_BT) != pad_id


def concat_documents(docs: Sequence[Sequence[int] | np.ndarray], eot_id: int | None
                     ) -> np.ndarray:
    """Join documents into one int32 stream, each followed by `eot_id` (GPT-2 style).

    With `eot_id=None` documents are joined with no separator.
    """
    parts = []
    for d in docs:
        parts.append(np.asarray(d, dtype=np.int32).reshape(-1))
        if eot_id is not None:
            parts.append(np.array([eot_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def pack_tokens(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a 1-D token stream into non-overlapping rows `[N, seq_len]`, dropping the tail.

    For next-token training use `seq_len = context + 1`; `ar_shift` then gives inputs and
    targets of length `context`.
    """
    stream = np.asarray(stream).reshape(-1)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    n = stream.size // seq_len
    if n == 0:
        raise ValueError(f"stream of {stream.size} tokens is shorter than seq_len={seq_len}")
    return stream[: n * seq_len].reshape(n, seq_len)


@dataclass(frozen=True)
class IteratorState:
    """Where a `BatchIterator` stands: the next batch is batch `step` of epoch `epoch`.

    seed, batch_size and num_examples are stored too, so that restoring into an iterator
    built differently is refused instead of silently giving another stream.
    """

    epoch: int
    step: int
    seed: int
    batch_size: int
    num_examples: int

    def to_dict(self) -> dict[str, int]:
        """Plain ints, for a JSON or checkpoint."""
        return {k: int(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "IteratorState":
        """Inverse of `to_dict`."""
        return cls(**{k: int(d[k]) for k in ("epoch", "step", "seed", "batch_size",
                                             "num_examples")})


Data = np.ndarray | Mapping[str, np.ndarray] | Sequence[Any]
Transform = Callable[[Any, np.random.Generator], Any]


class BatchIterator:
    """Seeded batches of `batch_size` examples, reshuffled every epoch, resumable.

    data: an array `[N, ...]`, a dict of arrays with the same N (batched per key), or a
      sequence of N items (a batch is then a list, and `transform` should make arrays,
      e.g. `lambda b, rng: pad_batch(b, 128, pad_id)`).
    transform: `f(batch, rng)` applied to each batch, with a Generator seeded from
      (seed, epoch, step): MLM masking or span corruption stays reproducible on resume.
    drop_remainder: True (default) keeps every batch the same shape; False yields a
      smaller last batch.
    num_epochs: None for an endless stream.

    `it.state` is the position to checkpoint; `it.set_state(state)` (or
    `BatchIterator(..., state=...)`) continues exactly the same stream.
    """

    def __init__(self, data: Data, batch_size: int, seed: int = 0, *, shuffle: bool = True,
                 drop_remainder: bool = True, transform: Transform | None = None,
                 num_epochs: int | None = None,
                 state: IteratorState | Mapping[str, Any] | None = None):
        self._data = data
        self._n = self._length(data)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if drop_remainder and self._n < batch_size:
            raise ValueError(f"{self._n} examples cannot fill one batch of {batch_size}")
        if self._n == 0:
            raise ValueError("no examples to batch")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_remainder = drop_remainder
        self.transform = transform
        self.num_epochs = num_epochs
        self._epoch, self._step = 0, 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1
        if state is not None:
            self.set_state(state)

    @staticmethod
    def _length(data: Data) -> int:
        if isinstance(data, np.ndarray):
            if data.ndim == 0:
                raise ValueError("data must have a leading example axis")
            return data.shape[0]
        if isinstance(data, Mapping):
            lengths = {k: len(v) for k, v in data.items()}
            if not lengths or len(set(lengths.values())) != 1:
                raise ValueError(f"dict data needs arrays of one common length, got {lengths}")
            return next(iter(lengths.values()))
        return len(data)

    @property
    def num_examples(self) -> int:
        """N."""
        return self._n

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch."""
        full, rest = divmod(self._n, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    @property
    def state(self) -> IteratorState:
        """The position of the next batch."""
        return IteratorState(self._epoch, self._step, self.seed, self.batch_size, self._n)

    def set_state(self, state: IteratorState | Mapping[str, Any]) -> None:
        """Continue from a saved position (refused if the iterator was built differently)."""
        if not isinstance(state, IteratorState):
            state = IteratorState.from_dict(state)
        mine = (self.seed, self.batch_size, self._n)
        theirs = (state.seed, state.batch_size, state.num_examples)
        if mine != theirs:
            raise ValueError(f"state is for (seed, batch_size, num_examples)={theirs}, "
                             f"this iterator has {mine}")
        if state.epoch < 0 or not 0 <= state.step <= self.steps_per_epoch:
            raise ValueError(f"state position (epoch={state.epoch}, step={state.step}) is out "
                             f"of range ({self.steps_per_epoch} steps per epoch)")
        self._epoch, self._step = state.epoch, state.step
        self._normalise()

    def _normalise(self) -> None:
        if self._step >= self.steps_per_epoch:
            self._epoch, self._step = self._epoch + 1, 0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The example order of `epoch` (a permutation from (seed, epoch), or 0..N-1)."""
        if not self.shuffle:
            return np.arange(self._n)
        if self._order_epoch != epoch:
            self._order = np.random.default_rng([self.seed, 0, epoch]).permutation(self._n)
            self._order_epoch = epoch
        return self._order

    def batch_rng(self, epoch: int, step: int) -> np.random.Generator:
        """The Generator handed to `transform` for batch (epoch, step)."""
        return np.random.default_rng([self.seed, 1, epoch, step])

    def _gather(self, idx: np.ndarray):
        d = self._data
        if isinstance(d, np.ndarray):
            return d[idx]
        if isinstance(d, Mapping):
            return {k: np.asarray(v)[idx] for k, v in d.items()}
        return [d[i] for i in idx.tolist()]

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self):
        if self.num_epochs is not None and self._epoch >= self.num_epochs:
            raise StopIteration
        epoch, step = self._epoch, self._step
        idx = self.epoch_order(epoch)[step * self.batch_size: (step + 1) * self.batch_size]
        batch = self._gather(idx)
        if self.transform is not None:
            batch = self.transform(batch, self.batch_rng(epoch, step))
        self._step += 1
        self._normalise()
        return batch
