"""Training objectives as pure, seeded NumPy functions: AR shift, BERT MLM, T5 span corruption.

Every random function takes `rng`, either an int seed (the result is then a pure
function of the arguments) or a `np.random.Generator` (advanced in place). Labels use
-100 for "no loss here", the ignore index of `txjax.ops.cross_entropy`.

The T5 functions keep the names and algorithm of the T5 reference code
(`t5/data/preprocessors.py`), on 1-D NumPy arrays instead of TF tensors.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

__all__ = [
    "IGNORE_INDEX",
    "ar_shift",
    "as_rng",
    "mlm_mask",
    "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel",
    "random_spans_helper",
    "random_spans_noise_mask",
    "t5_span_corruption",
    "t5_span_corruption_batch",
]

IGNORE_INDEX = -100
"""Label value that cross-entropy skips."""


def as_rng(rng: int | np.random.Generator | np.random.SeedSequence) -> np.random.Generator:
    """An int seed or SeedSequence -> a fresh Generator; a Generator passes through."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be an int seed or np.random.Generator, got {type(rng).__name__}")


# --------------------------------------------------------------------------- AR


def ar_shift(tokens_BT: np.ndarray, loss_mask_BT: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Next-token prediction: inputs `tokens[:, :-1]`, targets `tokens[:, 1:]`.

    Both come back with length T - 1 (pack sequences to context + 1 tokens). Where
    `loss_mask_BT` (aligned with `tokens_BT`) is False, the target is -100.
    """
    tokens_BT = np.asarray(tokens_BT)
    if tokens_BT.ndim != 2 or tokens_BT.shape[1] < 2:
        raise ValueError(f"tokens must be [B, T] with T >= 2, got {tokens_BT.shape}")
    inputs_BT = tokens_BT[:, :-1]
    targets_BT = tokens_BT[:, 1:].astype(np.int32)
    if loss_mask_BT is not None:
        loss_mask_BT = np.asarray(loss_mask_BT, dtype=bool)
        if loss_mask_BT.shape != tokens_BT.shape:
            raise ValueError(f"loss mask shape {loss_mask_BT.shape} != tokens {tokens_BT.shape}")
        targets_BT = np.where(loss_mask_BT[:, 1:], targets_BT, IGNORE_INDEX).astype(np.int32)
    return inputs_BT, targets_BT


# --------------------------------------------------------------------------- MLM


def mlm_mask(
    tokens_BT: np.ndarray,
    rng: int | np.random.Generator,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Collection[int],
    rate: float = 0.15,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: returns (inputs_BT, labels_BT).

    In each row exactly `max(1, round(rate * n))` positions are chosen uniformly among
    the n non-special tokens (none if n = 0; `round` is Python's, half to even). Each
    chosen token becomes `mask_id` with probability `mask_prob`, a uniformly random
    non-special id with `random_prob` (it may equal the original, as in BERT), and stays
    as it is otherwise. Labels hold the original token at chosen positions, -100 elsewhere.
    Special tokens ([PAD], [CLS], [SEP], ...) are never chosen.
    """
    rng = as_rng(rng)
    tokens_BT = np.asarray(tokens_BT)
    if tokens_BT.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got {tokens_BT.shape}")
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
        raise ValueError("mask_prob and random_prob must be >= 0 with sum <= 1")
    special = np.asarray(sorted(set(int(i) for i in special_ids)), dtype=np.int64)
    if mask_id not in special:
        raise ValueError(f"mask_id {mask_id} must be one of special_ids")
    ordinary = np.setdiff1d(np.arange(vocab_size), special)
    if ordinary.size == 0:
        raise ValueError("no ordinary (non-special) ids to draw random tokens from")
    if tokens_BT.size and (tokens_BT.min() < 0 or tokens_BT.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size - 1}]")

    b, t = tokens_BT.shape
    candidate_BT = ~np.isin(tokens_BT, special)
    n_B = candidate_BT.sum(axis=1)
    k_B = np.array([max(1, round(rate * int(n))) if n else 0 for n in n_B], dtype=np.int64)
    # a random key per position, +inf for specials; the k smallest keys are chosen
    keys_BT = np.where(candidate_BT, rng.random((b, t)), np.inf)
    rank_BT = np.argsort(np.argsort(keys_BT, axis=1, kind="stable"), axis=1, kind="stable")
    chosen_BT = rank_BT < k_B[:, None]

    u_BT = rng.random((b, t))
    random_tokens_BT = ordinary[rng.integers(0, ordinary.size, size=(b, t))]
    inputs_BT = np.where(chosen_BT & (u_BT < mask_prob), mask_id, tokens_BT)
    use_random_BT = chosen_BT & (u_BT >= mask_prob) & (u_BT < mask_prob + random_prob)
    inputs_BT = np.where(use_random_BT, random_tokens_BT, inputs_BT)
    labels_BT = np.where(chosen_BT, tokens_BT, IGNORE_INDEX)
    return inputs_BT.astype(np.int32), labels_BT.astype(np.int32)


# --------------------------------------------------------------------------- T5


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator
                         ) -> np.ndarray:
    """A uniformly random composition of `num_items` into `num_segments` positive parts."""
    first_in_segment = np.zeros(num_items, dtype=np.int64)
    marks = (np.arange(num_items - 1) < num_segments - 1).astype(np.int64)
    first_in_segment[1:] = rng.permutation(marks)
    segment_id = np.cumsum(first_in_segment)
    return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(
    length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    rng: int | np.random.Generator | None = None,
) -> np.ndarray:
    """T5's noise mask: bool `[length]`, True at noise (to be predicted) positions.

    num_noise = round(length * noise_density) clipped to [1, length - 1];
    num_spans = max(1, round(num_noise / mean_noise_span_length)); noise and non-noise
    lengths are each a uniformly random composition into num_spans parts, interleaved
    starting with non-noise and ending with noise. As in the reference, length 1 gives
    no noise. One guard the reference lacks: num_spans is also clipped to the numbers of
    noise and non-noise tokens, so extreme densities give a valid mask instead of a crash.
    """
    if rng is None:
        raise TypeError("random_spans_noise_mask needs rng (an int seed or a Generator)")
    rng = as_rng(rng)
    orig_length = int(length)
    if orig_length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if not 0.0 <= noise_density <= 1.0:
        raise ValueError(f"noise_density must be in [0, 1], got {noise_density}")
    if mean_noise_span_length <= 0:
        raise ValueError(f"mean_noise_span_length must be > 0, got {mean_noise_span_length}")
    length = max(orig_length, 2)
    num_noise = int(np.round(length * noise_density))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = max(int(np.round(num_noise / mean_noise_span_length)), 1)
    num_nonnoise = length - num_noise
    num_spans = min(num_spans, num_noise, num_nonnoise)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    span_starts = np.cumsum(interleaved)[:-1]
    indicator = np.zeros(length, dtype=np.int64)
    indicator[span_starts] = 1
    span_num = np.cumsum(indicator)
    return (span_num % 2 == 1)[:orig_length]


def noise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                  vocab_size: int) -> np.ndarray:
    """Replace each noise span by one sentinel: the first by vocab_size - 1, then - 2, ...

    Example: tokens [10..15], mask [T, T, F, F, T, F], vocab 1000 -> [999, 12, 13, 998, 15].
    """
    tokens = np.asarray(tokens)
    noise_mask = np.asarray(noise_mask, dtype=bool)
    if tokens.ndim != 1 or tokens.shape != noise_mask.shape:
        raise ValueError(f"tokens {tokens.shape} and noise_mask {noise_mask.shape} must be "
                         "1-D of the same length")
    prev_is_noise = np.concatenate([[False], noise_mask[:-1]])
    first_noise = noise_mask & ~prev_is_noise
    subsequent_noise = noise_mask & prev_is_noise
    sentinel = vocab_size - np.cumsum(first_noise)  # (vocab_size - 1) + 1 - cumsum
    out = np.where(first_noise, sentinel, tokens)
    return out[~subsequent_noise].astype(np.int32)


def nonnoise_span_to_unique_sentinel(tokens: np.ndarray, noise_mask: np.ndarray,
                                     vocab_size: int) -> np.ndarray:
    """The targets side: each non-noise span becomes a sentinel, noise tokens stay."""
    return noise_span_to_unique_sentinel(tokens, ~np.asarray(noise_mask, dtype=bool), vocab_size)


def random_spans_helper(inputs_length: int, noise_density: float = 0.15,
                        mean_noise_span_length: float = 3.0,
                        extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
    """T5's helper: how many raw tokens fill `inputs_length` encoder slots (with EOS) after
    span corruption, and the matching targets length. Returns (tokens_length, targets_length).
    """

    def lengths(tokens_length: int) -> tuple[int, int]:
        # The counts of `random_spans_noise_mask`, clips included (T5's helper omits them, so it
        # under-counts one sentinel when round(num_noise / mean) is 0, as for long mean spans).
        length = max(tokens_length, 2)
        num_noise = min(max(int(np.round(length * noise_density)), 1), length - 1)
        num_nonnoise = length - num_noise
        num_spans = min(max(int(np.round(num_noise / mean_noise_span_length)), 1), num_noise, num_nonnoise)
        return (num_nonnoise + num_spans * extra_tokens_per_span_inputs + 1,
                num_noise + num_spans * extra_tokens_per_span_targets + 1)

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def t5_span_corruption(
    tokens: np.ndarray,
    rng: int | np.random.Generator,
    *,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    inputs_length: int,
    targets_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> dict[str, np.ndarray]:
    """One T5 pre-training example from raw tokens `[L]` (no EOS).

    Returns int32 arrays:
      encoder_inputs  `[inputs_length]`: corrupted tokens + EOS, then pad_id;
      decoder_targets `[targets_length]`: sentinel/noise tokens + EOS, then pad_id;
      decoder_inputs  `[targets_length]`: targets shifted right, starting with pad_id
                      (T5's decoder start token);
      labels          `[targets_length]`: decoder_targets with -100 at padding.
    Raises ValueError if the corrupted sequences do not fit (see `random_spans_helper`
    for a raw length that fits). Sentinels are vocab_size - 1, vocab_size - 2, ...
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D array, got shape {tokens.shape}")
    noise = random_spans_noise_mask(tokens.size, noise_density, mean_noise_span_length, rng)
    enc = np.append(noise_span_to_unique_sentinel(tokens, noise, vocab_size), eos_id)
    tgt = np.append(nonnoise_span_to_unique_sentinel(tokens, noise, vocab_size), eos_id)
    if enc.size > inputs_length or tgt.size > targets_length:
        raise ValueError(
            f"{tokens.size} tokens corrupt to {enc.size} inputs / {tgt.size} targets (with EOS), "
            f"more than inputs_length={inputs_length} / targets_length={targets_length}")
    encoder_inputs = np.full(inputs_length, pad_id, dtype=np.int32)
    encoder_inputs[: enc.size] = enc
    decoder_targets = np.full(targets_length, pad_id, dtype=np.int32)
    decoder_targets[: tgt.size] = tgt
    decoder_inputs = np.concatenate([[pad_id], decoder_targets[:-1]]).astype(np.int32)
    labels = np.full(targets_length, IGNORE_INDEX, dtype=np.int32)
    labels[: tgt.size] = tgt
    return {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs,
            "decoder_targets": decoder_targets, "labels": labels}


def t5_span_corruption_batch(
    rows: np.ndarray | list[np.ndarray],
    rng: int | np.random.Generator,
    **kwargs,
) -> dict[str, np.ndarray]:
    """`t5_span_corruption` on each row; returns the same keys stacked: `[B, S]` / `[B, T]`.

    `rows` may have different lengths (a list of 1-D arrays). kwargs as for one example.
    """
    rng = as_rng(rng)
    examples = [t5_span_corruption(np.asarray(r), rng, **kwargs) for r in rows]
    if not examples:
        raise ValueError("empty batch")
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}
