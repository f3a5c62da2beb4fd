"""BERT masked-language modelling on a character corpus: rows, 80/10/10 masking, the run, "_" filling."""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.config import BertConfig, ExecutionConfig
from txjax.data import IGNORE_INDEX, CharTokenizer, MLMPacking, mlm_mask, pack_tokens
from txjax.models import Bert
from txjax.tasks.text import (
    TextRunConfig,
    check_len,
    corpus_documents,
    corpus_split,
    describe_rows,
    encode_masked,
    first_rows,
    fit_numbers,
    n_params,
    train_with_held_out,
    with_vocab,
    write_summary,
)
from txjax.train.config import TrainConfig
from txjax.train.loop import prepare_run_dir
from txjax.train.steps import bert_loss


def bert_rows(ids: np.ndarray, tok: CharTokenizer, seq_len: int) -> np.ndarray:
    """[CLS] + seq_len - 2 corpus tokens + [SEP], one row per non-overlapping chunk."""
    body = pack_tokens(ids, seq_len - 2)
    n = body.shape[0]
    return np.concatenate([np.full((n, 1), tok.cls_id), body, np.full((n, 1), tok.sep_id)], axis=1).astype(np.int32)


def mlm_transform(tok: CharTokenizer, rate: float):
    """BatchIterator transform: rows -> {inputs, targets} with BERT's 80/10/10 masking."""

    def transform(rows_BT, rng):
        inputs_BT, targets_BT = mlm_mask(rows_BT, rng, mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                                         special_ids=tok.special_ids, rate=rate)
        return {"inputs": inputs_BT, "targets": targets_BT}

    return transform


def unigram_baseline(train_ids, targets, special_ids) -> dict:
    """Accuracy of always predicting the training text's commonest ordinary token, over the scored targets."""
    ids = np.asarray(train_ids).ravel()
    ids = ids[~np.isin(ids, np.asarray(special_ids))]
    top = int(np.bincount(ids).argmax())
    t = np.asarray(targets).ravel()
    t = t[t != IGNORE_INDEX]
    return {"token": top, "accuracy": float((t == top).mean()) if t.size else 0.0}


def run_bert(model_cfg: BertConfig, train_cfg: TrainConfig, run_cfg: TextRunConfig, *,
             execution: ExecutionConfig | None = None, stop_at: int | None = None, log=print) -> dict:
    """Train BERT with MLM; report held-out MLM loss and accuracy; write the run folder."""
    prepare_run_dir(run_cfg.run_dir)  # fail before loading data; emptied (overwrite) only once claimed
    t0 = time.perf_counter()
    if run_cfg.packing == "stream":
        tok, train_ids, held_ids, name = corpus_split(run_cfg, "bert")
        train_flat = train_ids
        transform = mlm_transform(tok, run_cfg.mask_rate)
        train_rows, held_rows = (bert_rows(ids, tok, run_cfg.seq_len) for ids in (train_ids, held_ids))
    else:  # documents, each [CLS] doc [SEP], packed or one per row, with document ids
        tok, train_docs, held_docs, name = corpus_documents(run_cfg, "bert")
        train_flat = np.concatenate([np.asarray(d).ravel() for d in train_docs])
        transform = MLMPacking.from_tokenizer(tok, run_cfg.seq_len, run_cfg.mask_rate)
        train_rows, held_rows = (transform.rows(docs, packing=run_cfg.packing == "packed")
                                 for docs in (train_docs, held_docs))
    model_cfg = with_vocab(model_cfg, tok.vocab_size, pad_id=tok.pad_id)
    check_len(model_cfg, run_cfg.seq_len)
    held_rows = first_rows(held_rows, run_cfg.heldout_examples)
    log(f"corpus {name} ({run_cfg.packing}): {describe_rows(train_rows)} train / {describe_rows(held_rows)} "
        f"held-out of {run_cfg.seq_len} tokens, vocab {tok.vocab_size}")
    model = Bert(model_cfg, rngs=nnx.Rngs(train_cfg.seed), execution=execution)
    log(f"BERT: {n_params(model):,} parameters")
    _, _, fit_summary, held, final = train_with_held_out(
        model, bert_loss, transform, train_rows, held_rows, tok, train_cfg, run_cfg, stop_at=stop_at, log=log)
    base = unigram_baseline(train_flat, held["targets"], tok.special_ids)
    summary = {"heldout_mlm_loss": final["loss"], "heldout_mlm_accuracy": final["accuracy"],
               "heldout_unigram_baseline_accuracy": base["accuracy"],
               "unigram_baseline_token": tok.decode([base["token"]]),
               "heldout_predicted_tokens": final["tokens"], **fit_numbers(fit_summary),
               "total_wall_s": time.perf_counter() - t0}
    write_summary(run_cfg, summary, "MLM loss (nats / masked token)")
    log(f"held-out MLM loss {final['loss']:.4f} nats/token, accuracy {final['accuracy']:.4f} "
        f"over {int(final['tokens'])} masked tokens "
        f"(unigram baseline, always {tok.decode([base['token']])!r}: {base['accuracy']:.4f})")
    return summary


def fill_masks(model, tok: CharTokenizer, prompt: str) -> str:
    """BERT: replace every '_' in prompt by the most likely ordinary character; fills in [brackets]."""
    ids = [tok.cls_id] + encode_masked(tok, prompt, lambda k, run: [tok.mask_id] * run) + [tok.sep_id]
    logits_V = np.asarray(model(jnp.asarray([ids], jnp.int32))[0], np.float64)
    logits_V[:, tok.special_ids] = -np.inf
    out, run = [], []
    for i, t in enumerate(ids[1:-1], start=1):
        if t == tok.mask_id:
            run.append(tok.decode([int(np.argmax(logits_V[i]))]))
            continue
        if run:
            out.append("[" + "".join(run) + "]")
            run = []
        out.append(tok.decode([t]))
    if run:
        out.append("[" + "".join(run) + "]")
    return "".join(out)


__all__ = ["bert_rows", "fill_masks", "mlm_transform", "run_bert", "unigram_baseline"]
