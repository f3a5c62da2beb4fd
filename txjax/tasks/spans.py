"""T5 span corruption on a character corpus: the corruption transform, the run, decoding, "_" filling."""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.config import ExecutionConfig, T5Config
from txjax.data import CharTokenizer, SpanPacking, pack_tokens, random_spans_helper, t5_span_corruption_batch
from txjax.decoding import generate
from txjax.models import T5
from txjax.tasks.text import (
    TextRunConfig,
    batches_of,
    check_len,
    corpus_documents,
    corpus_split,
    describe_rows,
    encode_masked,
    first_rows,
    fit_numbers,
    masked_prompt,
    n_params,
    train_with_held_out,
    with_vocab,
    write_summary,
)
from txjax.train.config import TrainConfig
from txjax.train.loop import prepare_run_dir
from txjax.train.multihost import addressable
from txjax.train.steps import t5_loss


def t5_lengths(run_cfg: TextRunConfig) -> tuple[int, int]:
    """(raw tokens per example, decoder length) so corrupted inputs fill seq_len slots."""
    return random_spans_helper(run_cfg.seq_len, run_cfg.mask_rate, run_cfg.mean_span)


def span_transform(tok: CharTokenizer, run_cfg: TextRunConfig):
    """BatchIterator transform: raw rows -> {enc_inputs, dec_inputs, targets} by span corruption."""
    _, targets_length = t5_lengths(run_cfg)

    def transform(rows_BL, rng):
        ex = t5_span_corruption_batch(rows_BL, rng, vocab_size=tok.vocab_size, eos_id=tok.eos_id,
                                      pad_id=tok.pad_id, inputs_length=run_cfg.seq_len,
                                      targets_length=targets_length, noise_density=run_cfg.mask_rate,
                                      mean_noise_span_length=run_cfg.mean_span)
        return {"enc_inputs": ex["encoder_inputs"], "dec_inputs": ex["decoder_inputs"],
                "targets": ex["labels"]}

    return transform


def t5_decode(model, enc_BS: np.ndarray, length: int, key, temperature: float = 0.0,
              top_k: int | None = None, lengths_B: np.ndarray | None = None) -> np.ndarray:
    """`length` decoder tokens per row from `txjax.generate`, the start token dropped; lengths_B:
    the encoder reads only each row's first L_b tokens."""
    out = generate(model, jnp.asarray(enc_BS), length, key, temperature=temperature, top_k=top_k,
                   prompt_lengths=lengths_B)
    return np.asarray(out)[:, 1:]


def fill_spans(model, tok: CharTokenizer, prompt: str, key, temperature: float = 0.0,
               top_k: int | None = None) -> str:
    """T5: each run of '_' becomes one sentinel; the decoded spans are put back in [brackets]."""
    pieces = masked_prompt(prompt)
    ids = encode_masked(tok, prompt, lambda k, run: [tok.sentinel_id(k)]) + [tok.eos_id]
    n_spans = sum(1 for _, run in pieces if run)
    length = 2 * n_spans + 2 * sum(run for _, run in pieces) + 2
    out = t5_decode(model, np.asarray([ids], np.int32), length, key, temperature, top_k)[0]
    spans: dict[int, str] = {}
    current = None
    sentinels = set(tok.sentinel_ids.tolist())
    for t in out.tolist():
        if t in (tok.eos_id, tok.pad_id):
            break
        if t in sentinels:
            current = tok.vocab_size - 1 - t
            spans[current] = ""
        elif current is not None:
            spans[current] += tok.decode([t])
    text, k = [], 0
    for chunk, run in pieces:
        text.append(chunk)
        if run:
            text.append("[" + spans.get(k, "") + "]")
            k += 1
    return "".join(text)


def show_spans(tok: CharTokenizer, ids: np.ndarray) -> str:
    """Readable span text: up to EOS, sentinels as <k>, no padding."""
    out = []
    sentinels = set(tok.sentinel_ids.tolist())
    for i in np.asarray(ids).tolist():
        if i == tok.eos_id:
            break
        if i == tok.pad_id:
            continue
        if i in sentinels:
            out.append(f"<{tok.vocab_size - 1 - i}>")
        else:
            out.append(tok.decode([i]))
    return "".join(out)


BLANK_SAMPLE = 64
"""Held-out rows decoded greedily for `blank_span_share` in a run's summary."""


def _spans(predicted: list[str]) -> list[str]:
    return [piece for text in predicted for piece in re.split(r"<\d+>", text)[1:]]


def blank_span_share(predicted: list[str]) -> float:
    """Share of predicted span texts (`show_spans` strings) whose spans are all empty or whitespace."""
    spans = _spans(predicted)
    return sum(1 for sp in spans if not sp.strip()) / len(spans) if spans else 0.0


def distinct_span_share(predicted: list[str]) -> float:
    """Distinct predicted span texts over all predicted spans: near 0 when the decoder writes the
    same spans whatever the encoder reads (an unconditional language model of the targets)."""
    spans = _spans(predicted)
    return len(set(spans)) / len(spans) if spans else 0.0


def encoder_shuffled(batch: dict) -> dict:
    """The batch with each row's encoder input (and its document ids) taken from the next row:
    the held-out loss on it, beside the real one, says how much the decoder reads the encoder."""
    return {k: np.roll(v, 1, axis=0) if k.startswith("enc_") else v for k, v in batch.items()}


def run_t5(model_cfg: T5Config, train_cfg: TrainConfig, run_cfg: TextRunConfig, *,
           execution: ExecutionConfig | None = None, stop_at: int | None = None, log=print) -> dict:
    """Train T5 with span corruption; report held-out loss and print decoded spans beside the truth."""
    prepare_run_dir(run_cfg.run_dir)  # fail before loading data; emptied (overwrite) only once claimed
    t0 = time.perf_counter()
    raw_len, targets_length = t5_lengths(run_cfg)
    if run_cfg.packing == "stream":
        tok, train_ids, held_ids, name = corpus_split(run_cfg, "t5", run_cfg.num_sentinels)
        transform = span_transform(tok, run_cfg)
        train_rows, held_rows = pack_tokens(train_ids, raw_len), pack_tokens(held_ids, raw_len)
    else:  # documents, each corrupted on its own, packed or one per row, with document ids
        tok, train_docs, held_docs, name = corpus_documents(run_cfg, "t5", run_cfg.num_sentinels)
        transform = SpanPacking.from_tokenizer(tok, run_cfg.seq_len, targets_length, run_cfg.mask_rate,
                                               run_cfg.mean_span)
        train_rows, held_rows = (transform.rows(docs, packing=run_cfg.packing == "packed")
                                 for docs in (train_docs, held_docs))
    model_cfg = with_vocab(model_cfg, tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                            decoder_start_id=tok.pad_id)
    check_len(model_cfg, max(run_cfg.seq_len, targets_length))
    held_rows = first_rows(held_rows, run_cfg.heldout_examples)
    log(f"corpus {name} ({run_cfg.packing}): {describe_rows(train_rows)} train / {describe_rows(held_rows)} "
        f"held-out; {raw_len} raw tokens -> {run_cfg.seq_len} encoder / {targets_length} decoder tokens, "
        f"vocab {tok.vocab_size}")
    model = T5(model_cfg, rngs=nnx.Rngs(train_cfg.seed), execution=execution)
    log(f"T5: {n_params(model):,} parameters")
    stepper, state, fit_summary, held, final = train_with_held_out(
        model, t5_loss, transform, train_rows, held_rows, tok, train_cfg, run_cfg, stop_at=stop_at, log=log)
    # Greedy spans for at least BLANK_SAMPLE held-out rows (the blank-span share); `show` of them printed.
    n = min(max(run_cfg.show, BLANK_SAMPLE), len(held["enc_inputs"]))
    # A packed row shows its first document: the encoder reads up to that document's end.
    ids = held.get("enc_document_ids")
    lengths = None if ids is None else (ids[:n] == 0).sum(axis=1)
    params = stepper.eval_params(state)
    pred = t5_decode(stepper.model(addressable(params)), held["enc_inputs"][:n], targets_length,
                     jax.random.key(train_cfg.seed), temperature=0.0, lengths_B=lengths)
    predicted = [show_spans(tok, row) for row in pred]
    shuffled = stepper.evaluate(params, batches_of(encoder_shuffled(held), run_cfg.eval_batch_size)
                                or [encoder_shuffled(held)])
    examples = [{"input": show_spans(tok, held["enc_inputs"][i]), "truth": show_spans(tok, held["targets"][i]),
                 "predicted": predicted[i]} for i in range(min(run_cfg.show, n))]
    summary = {"heldout_loss": final["loss"], "heldout_token_accuracy": final["accuracy"],
               "heldout_target_tokens": final["tokens"],
               "heldout_loss_encoder_shuffled": shuffled["loss"], "heldout_accuracy_encoder_shuffled": shuffled["accuracy"],
               "blank_span_share": blank_span_share(predicted), "distinct_span_share": distinct_span_share(predicted),
               "blank_span_examples": n, "examples": examples,
               **fit_numbers(fit_summary), "total_wall_s": time.perf_counter() - t0}
    write_summary(run_cfg, summary, "span loss (nats / target token)")
    log(f"held-out span-corruption loss {final['loss']:.4f} nats/token, token accuracy {final['accuracy']:.4f} "
        f"({shuffled['loss']:.4f} / {shuffled['accuracy']:.4f} with the encoder rows shuffled); predicted spans over "
        f"{n} rows: {summary['blank_span_share']:.3f} blank (empty or whitespace), "
        f"{summary['distinct_span_share']:.3f} distinct")
    for ex in examples:
        log(f"  input:     {ex['input']!r}\n  truth:     {ex['truth']!r}\n  predicted: {ex['predicted']!r}")
    return summary


__all__ = ["blank_span_share", "distinct_span_share", "encoder_shuffled", "fill_spans", "run_t5", "show_spans", "span_transform", "t5_decode", "t5_lengths"]
