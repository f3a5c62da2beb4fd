"""Copy and reverse: the task's rows and how a model's answers are read.

Ids: 0 PAD, 1 BOS, 2 SEP, 3 EOS, then the symbols. The decoder-only row is `[prefix] BOS x SEP y EOS`,
scored on `y EOS`; the encoder-decoder one encodes `x EOS` and decodes `PAD y` (PAD is T5's start
token) against `y EOS`. Rows are right-padded, which a causal model never sees and T5's encoder masks.
The read-outs take argmax predictions under teacher forcing: exact match and, to locate a failure,
accuracy per answer token and where along the input a prediction was read from. The per-token
profiles are stored to 4 decimals (shares of at most a few thousand tokens).
"""

from __future__ import annotations

import numpy as np

from txjax.data import IGNORE_INDEX

PAD, BOS, SEP, EOS = 0, 1, 2, 3
NUM_SPECIAL = 4
TASKS = ("copy", "reverse")


def task_output(task: str, x: np.ndarray) -> np.ndarray:
    """The target sequence for input x."""
    if task == "copy":
        return x.copy()
    if task == "reverse":
        return x[::-1].copy()
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def sample_inputs(rng: np.random.Generator, n: int, min_len: int, max_len: int, num_symbols: int) -> list[np.ndarray]:
    """n random symbol strings with lengths uniform in [min_len, max_len]."""
    lengths = rng.integers(min_len, max_len + 1, n)
    return [rng.integers(NUM_SPECIAL, NUM_SPECIAL + num_symbols, k).astype(np.int32) for k in lengths]


def decoder_only_batch(task: str, xs: list[np.ndarray], max_len: int,
                       prefixes: list[np.ndarray] | None = None, prefix_max: int = 0) -> dict[str, np.ndarray]:
    """GPT: [prefix] BOS x SEP y EOS right-padded to prefix_max + 2 * max_len + 3 tokens; targets only
    on y EOS. A prefix (at most prefix_max tokens, none by default) is attended but not scored.

    inputs/targets are [B, prefix_max + 2 * max_len + 2] (the next-token shift of the padded rows).
    """
    prefixes = [np.zeros(0, np.int32)] * len(xs) if prefixes is None else prefixes
    width = prefix_max + 2 * max_len + 3
    rows = np.full((len(xs), width), PAD, np.int32)
    scored = np.zeros((len(xs), width), bool)
    for i, (p, x) in enumerate(zip(prefixes, xs)):
        k, j = len(x), len(p)
        if k > max_len or j > prefix_max:
            raise ValueError(f"input of length {k} or prefix of length {j} exceeds max_len={max_len} "
                             f"or prefix_max={prefix_max}")
        rows[i, : j + 2 * k + 3] = np.concatenate([p, [BOS], x, [SEP], task_output(task, x), [EOS]])
        scored[i, j + k + 2: j + 2 * k + 3] = True  # y and EOS
    targets = np.where(scored[:, 1:], rows[:, 1:], IGNORE_INDEX).astype(np.int32)
    return {"inputs": rows[:, :-1], "targets": targets}


def encoder_decoder_batch(task: str, xs: list[np.ndarray], max_len: int) -> dict[str, np.ndarray]:
    """T5: encoder `x EOS`, decoder `PAD y`, targets `y EOS`; each [B, max_len + 1], padded."""
    n = len(xs)
    enc = np.full((n, max_len + 1), PAD, np.int32)
    dec = np.full((n, max_len + 1), PAD, np.int32)
    tgt = np.full((n, max_len + 1), IGNORE_INDEX, np.int32)
    for i, x in enumerate(xs):
        k = len(x)
        if k > max_len:
            raise ValueError(f"input of length {k} exceeds max_len={max_len}")
        y = task_output(task, x)
        enc[i, : k + 1] = np.concatenate([x, [EOS]])
        dec[i, 1: k + 1] = y
        tgt[i, : k + 1] = np.concatenate([y, [EOS]])
    return {"enc_inputs": enc, "dec_inputs": dec, "targets": tgt}


BATCHERS = {"gpt": decoder_only_batch, "t5": encoder_decoder_batch}


def exact_match(pred_BT: np.ndarray, targets_BT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-example exact match, per-example token accuracy) of argmax predictions over targets
    that are not -100."""
    scored_BT = targets_BT != IGNORE_INDEX
    right_BT = (pred_BT == targets_BT) & scored_BT
    exact_B = np.all(right_BT | ~scored_BT, axis=-1)
    return exact_B, right_BT.sum(-1) / np.maximum(scored_BT.sum(-1), 1)


def match_by_distance(pred_BT: np.ndarray, inputs_BT: np.ndarray, targets_BT: np.ndarray,
                      lengths: list[int]) -> list[list]:
    """Decoder-only, per input length n: [n, [share at d = 1..2n+1]], the share of predicted answer
    tokens (EOS aside) equal to the token d positions before the query. A correct copy reads
    d = n; a model that copies from the offsets it was trained on peaks there instead."""
    out = []
    for n, pred, inputs, targets in _per_length(lengths, pred_BT, inputs_BT, targets_BT):
        scored = (targets != IGNORE_INDEX) & (targets != EOS)
        out.append([n, [_share(((pred[:, d:] == inputs[:, :-d]) & scored[:, d:]).sum() / scored.sum())
                        for d in range(1, 2 * n + 2)]])
    return out


def match_by_source_offset(task: str, pred_BT: np.ndarray, inputs_BT: np.ndarray, lengths: list[int]) -> list[list]:
    """Decoder-only rows without a prefix, per input length n: [n, [share at delta = 1-n..n-1]], the
    share of predicted answer tokens (EOS aside) equal to x_(j + delta), where x_j is the right
    source (copy: j = i, reverse: j = n + 1 - i). A model that reads relative to the start of x with
    a length it believes to be n' reverses from delta = n' - n."""
    out = []
    for n, pred, inputs in _per_length(lengths, pred_BT, inputs_BT):
        i = np.arange(1, n + 1)
        query, source = n + i, (i if task == "copy" else n + 1 - i)  # x_j sits at position j, after BOS
        shares = []
        for delta in range(1 - n, n):
            j = source + delta
            ok = (j >= 1) & (j <= n)
            shares.append(_share((pred[:, query[ok]] == inputs[:, j[ok]]).sum() / (len(pred) * n)))
        out.append([n, shares])
    return out


def accuracy_by_index(pred_BT: np.ndarray, targets_BT: np.ndarray, lengths: list[int]) -> list[list]:
    """Per input length n: [n, [accuracy of answer token i, i = 1..n, then of EOS]], teacher-forced.

    Where in a longer answer a model goes wrong. A decoder-only reverse reads token i from distance
    2i - 1 whatever n is, so a model that reads by distance alone gets the tokens whose distance it
    was trained on right at every length."""
    out = []
    for n, pred, targets in _per_length(lengths, pred_BT, targets_BT):
        scored = targets != IGNORE_INDEX  # n + 1 positions in every row of this length
        right = (pred[scored] == targets[scored]).reshape(len(pred), n + 1)
        out.append([n, [_share(a) for a in right.mean(0)]])
    return out


def exact_by_length(exact: np.ndarray, lengths: list[int]) -> list[list]:
    """[[length, exact match, examples], ...] per input length, as Kazemnejad et al.'s Figure 3 plots it."""
    return [[n, float(e.mean()), len(e)] for n, e in _per_length(lengths, exact)]


def _per_length(lengths: list[int], *arrays: np.ndarray):
    """(n, each array's rows whose input length is n), for each length present, shortest first."""
    lengths = np.asarray(lengths)
    for n in np.unique(lengths):
        yield (int(n), *(a[lengths == n] for a in arrays))


def _share(x) -> float:
    return round(float(x), 4)
