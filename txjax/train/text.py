"""The text experiments: BERT masked-language modelling and T5 span corruption.

Both read a corpus (tinyshakespeare from ../shared/data beside the repo when it is
there, else the packaged excerpt), build a character tokenizer with the family's special
tokens, hold out the last `heldout_fraction` of the text, and train through
`txjax.train.experiment.train_run`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import txjax
from txjax.config import BertConfig, T5Config
from txjax.data import (
    BatchIterator,
    CharTokenizer,
    load_corpus,
    mlm_mask,
    pack_tokens,
    random_spans_helper,
    t5_span_corruption_batch,
)
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.loop import prepare_run_dir, write_json
from txjax.train.plots import plot_loss_curve
from txjax.train.steps import Stepper, bert_loss, t5_loss


@dataclasses.dataclass(frozen=True)
class TextRunConfig(RunConfig):
    """The text run: corpus, sequence length, objective and evaluation."""

    corpus: str | None = None  # a UTF-8 file or a txjax.data corpus name; None: ../shared/data/tinyshakespeare.txt beside the repo if there, else the packaged excerpt
    seq_len: int = 128  # tokens per example (BERT: with [CLS] and [SEP]; T5: encoder length)
    heldout_fraction: float = 0.1  # the last part of the corpus, never trained on
    heldout_examples: int = 256  # held-out examples scored at the end
    eval_batch_size: int = 64  # examples per held-out batch
    mask_rate: float = 0.15  # BERT: fraction of tokens chosen for prediction; T5: noise density
    mean_span: float = 3.0  # T5: mean corrupted-span length
    num_sentinels: int = 32  # T5: sentinel ids at the top of the vocabulary
    show: int = 3  # T5: held-out examples whose decoded spans are printed beside the truth

    def __post_init__(self):
        super().__post_init__()
        for name in ("seq_len", "heldout_examples", "eval_batch_size", "num_sentinels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.mean_span < 1.0:
            raise ValueError(f"mean_span must be >= 1, got {self.mean_span}")
        if self.show < 0:
            raise ValueError(f"show must be >= 0, got {self.show}")


def default_corpus() -> str:
    """tinyshakespeare beside the repository if present, else the packaged excerpt."""
    candidate = Path(txjax.__file__).resolve().parent.parent.parent / "shared" / "data" / "tinyshakespeare.txt"
    return str(candidate) if candidate.is_file() else "default"


def corpus_split(run_cfg: TextRunConfig, family: str, num_sentinels: int | None = None):
    """(tokenizer, train ids, held-out ids, corpus name) with a char tokenizer for `family`."""
    name = run_cfg.corpus if run_cfg.corpus is not None else default_corpus()
    text = load_corpus(name)
    tok = CharTokenizer.from_corpus(text, family=family, num_sentinels=num_sentinels)
    ids = tok.encode(text)
    cut = int(len(ids) * (1.0 - run_cfg.heldout_fraction))
    return tok, ids[:cut], ids[cut:], name


def _n_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _batches_of(examples: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    n = len(next(iter(examples.values())))
    return [{k: v[i: i + size] for k, v in examples.items()} for i in range(0, n - size + 1, size)]


def _tokenizer_meta(tok: CharTokenizer) -> dict:
    return {"tokenizer": {"kind": "char", "family": tok.family, "chars": "".join(tok.chars),
                          "num_sentinels": tok.num_sentinels}}


def tokenizer_from_meta(meta: dict) -> CharTokenizer:
    t = meta["tokenizer"]
    return CharTokenizer(list(t["chars"]), family=t["family"], num_sentinels=t["num_sentinels"])


# --------------------------------------------------------------------------- BERT


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


def run_bert(model_cfg: BertConfig, train_cfg: TrainConfig, run_cfg: TextRunConfig, *,
             stop_at: int | None = None, log=print) -> dict:
    """Train BERT with MLM; report held-out MLM loss and accuracy; write the run folder."""
    prepare_run_dir(run_cfg.run_dir, overwrite=run_cfg.overwrite)  # fail before loading data
    t0 = time.perf_counter()
    tok, train_ids, held_ids, name = corpus_split(run_cfg, "bert")
    model_cfg = _with_vocab(model_cfg, tok.vocab_size, pad_id=tok.pad_id)
    _check_len(model_cfg, run_cfg.seq_len)
    train_rows, held_rows = bert_rows(train_ids, tok, run_cfg.seq_len), bert_rows(held_ids, tok, run_cfg.seq_len)
    held_rows = held_rows[: run_cfg.heldout_examples]
    log(f"corpus {name}: {len(train_rows)} train / {len(held_rows)} held-out rows of {run_cfg.seq_len}, "
        f"vocab {tok.vocab_size}")
    model = txjax.Bert(model_cfg, rngs=nnx.Rngs(train_cfg.seed))
    log(f"BERT: {_n_params(model):,} parameters")
    transform = mlm_transform(tok, run_cfg.mask_rate)
    batches = BatchIterator(train_rows, train_cfg.batch_size, seed=train_cfg.seed, transform=transform)
    held = transform(held_rows, np.random.default_rng([train_cfg.seed, 99]))  # one fixed masking
    held_batches = _batches_of(held, run_cfg.eval_batch_size) or [held]

    def eval_fn(stepper, params):
        return stepper.evaluate(params, held_batches[: train_cfg.eval_batches])

    stepper, state, fit_summary = train_run(model, bert_loss, train_cfg, run_cfg, batches,
                                            extra_meta=_tokenizer_meta(tok), eval_fn=eval_fn,
                                            stop_at=stop_at, log=log)
    final = stepper.evaluate(state.params, held_batches)
    summary = {"heldout_mlm_loss": final["loss"], "heldout_mlm_accuracy": final["accuracy"],
               "heldout_predicted_tokens": final["tokens"], **_fit_numbers(fit_summary),
               "total_wall_s": time.perf_counter() - t0}
    _finish(run_cfg, summary, "MLM loss (nats / masked token)")
    log(f"held-out MLM loss {final['loss']:.4f} nats/token, accuracy {final['accuracy']:.4f} "
        f"over {int(final['tokens'])} masked tokens")
    return summary


# --------------------------------------------------------------------------- T5


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


def greedy_t5(model, enc_BS: np.ndarray, length: int, start_id: int) -> np.ndarray:
    """Greedy decoding of `length` tokens; a full decoder pass per token (small models only).

    Kept here so the script does not depend on txjax.decoding; uses the model's own
    `encode` / `decode` so the encoder runs once.
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, enc_BS):
        m = nnx.merge(graphdef, state)
        enc_BSD = m.encode(enc_BS)
        dec_BT = jnp.full((enc_BS.shape[0], length), start_id, enc_BS.dtype)

        def body(t, dec_BT):
            logits_BTV = m.decode(dec_BT, enc_BSD, enc_BS)
            nxt_B = jnp.argmax(logits_BTV[:, t], axis=-1).astype(dec_BT.dtype)
            return jax.lax.dynamic_update_slice(dec_BT, nxt_B[:, None], (0, t + 1))

        dec_BT = jax.lax.fori_loop(0, length - 1, body, dec_BT)
        last = jnp.argmax(m.decode(dec_BT, enc_BSD, enc_BS)[:, -1], axis=-1).astype(dec_BT.dtype)
        return jnp.concatenate([dec_BT[:, 1:], last[:, None]], axis=1)

    return np.asarray(run(state, jnp.asarray(enc_BS)))


def t5_decode(model, enc_BS: np.ndarray, length: int, key, temperature: float = 0.0,
              top_k: int | None = None) -> np.ndarray:
    """`length` decoder tokens per row (start token dropped): txjax.generate if present, else greedy_t5."""
    try:
        from txjax.decoding import generate
    except ImportError:
        return greedy_t5(model, enc_BS, length, model.config.decoder_start_id)
    out = generate(model, jnp.asarray(enc_BS), length, key, temperature=temperature, top_k=top_k)
    return np.asarray(out)[:, 1:]


def _encode_masked(tok: CharTokenizer, prompt: str, mask_run) -> list[int]:
    from txjax.train.sample import masked_prompt

    ids: list[int] = []
    for k, (chunk, run) in enumerate(masked_prompt(prompt)):
        ids += tok.encode(chunk, unknown="unk").tolist()
        ids += mask_run(k, run) if run else []
    return ids


def fill_masks(model, tok: CharTokenizer, prompt: str) -> str:
    """BERT: replace every '_' in prompt by the most likely ordinary character; fills in [brackets]."""
    ids = [tok.cls_id] + _encode_masked(tok, prompt, lambda k, run: [tok.mask_id] * run) + [tok.sep_id]
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


def fill_spans(model, tok: CharTokenizer, prompt: str, key, temperature: float = 0.0,
               top_k: int | None = None) -> str:
    """T5: each run of '_' becomes one sentinel; the decoded spans are put back in [brackets]."""
    pieces = _masked_pieces(prompt)
    ids = _encode_masked(tok, prompt, lambda k, run: [tok.sentinel_id(k)]) + [tok.eos_id]
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


def _masked_pieces(prompt: str):
    from txjax.train.sample import masked_prompt

    return masked_prompt(prompt)


def show_spans(tok: CharTokenizer, ids: np.ndarray) -> str:
    """Readable span text: up to EOS, sentinels as <k>, no padding."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == tok.eos_id:
            break
        if i == tok.pad_id:
            continue
        if i in set(tok.sentinel_ids.tolist()):
            out.append(f"<{tok.vocab_size - 1 - i}>")
        else:
            out.append(tok.decode([i]))
    return "".join(out)


def run_t5(model_cfg: T5Config, train_cfg: TrainConfig, run_cfg: TextRunConfig, *,
           stop_at: int | None = None, log=print) -> dict:
    """Train T5 with span corruption; report held-out loss and print decoded spans beside the truth."""
    prepare_run_dir(run_cfg.run_dir, overwrite=run_cfg.overwrite)  # fail before loading data
    t0 = time.perf_counter()
    tok, train_ids, held_ids, name = corpus_split(run_cfg, "t5", run_cfg.num_sentinels)
    model_cfg = _with_vocab(model_cfg, tok.vocab_size, pad_id=tok.pad_id, eos_id=tok.eos_id,
                            decoder_start_id=tok.pad_id)
    raw_len, targets_length = t5_lengths(run_cfg)
    _check_len(model_cfg, max(run_cfg.seq_len, targets_length))
    train_rows, held_rows = pack_tokens(train_ids, raw_len), pack_tokens(held_ids, raw_len)
    held_rows = held_rows[: run_cfg.heldout_examples]
    log(f"corpus {name}: {len(train_rows)} train / {len(held_rows)} held-out examples; "
        f"{raw_len} raw tokens -> {run_cfg.seq_len} encoder / {targets_length} decoder tokens, vocab {tok.vocab_size}")
    model = txjax.T5(model_cfg, rngs=nnx.Rngs(train_cfg.seed))
    log(f"T5: {_n_params(model):,} parameters")
    transform = span_transform(tok, run_cfg)
    batches = BatchIterator(train_rows, train_cfg.batch_size, seed=train_cfg.seed, transform=transform)
    held = transform(held_rows, np.random.default_rng([train_cfg.seed, 99]))
    held_batches = _batches_of(held, run_cfg.eval_batch_size) or [held]

    def eval_fn(stepper, params):
        return stepper.evaluate(params, held_batches[: train_cfg.eval_batches])

    stepper, state, fit_summary = train_run(model, t5_loss, train_cfg, run_cfg, batches,
                                            extra_meta=_tokenizer_meta(tok), eval_fn=eval_fn,
                                            stop_at=stop_at, log=log)
    final = stepper.evaluate(state.params, held_batches)
    examples = []
    if run_cfg.show:
        n = min(run_cfg.show, len(held["enc_inputs"]))
        pred = t5_decode(stepper.model(state.params), held["enc_inputs"][:n], targets_length,
                         jax.random.key(train_cfg.seed), temperature=0.0)
        for i in range(n):
            examples.append({"input": show_spans(tok, held["enc_inputs"][i]),
                             "truth": show_spans(tok, held["targets"][i]),
                             "predicted": show_spans(tok, pred[i])})
    summary = {"heldout_loss": final["loss"], "heldout_token_accuracy": final["accuracy"],
               "heldout_target_tokens": final["tokens"], "examples": examples,
               **_fit_numbers(fit_summary), "total_wall_s": time.perf_counter() - t0}
    _finish(run_cfg, summary, "span loss (nats / target token)")
    log(f"held-out span-corruption loss {final['loss']:.4f} nats/token, token accuracy {final['accuracy']:.4f}")
    for ex in examples:
        log(f"  input:     {ex['input']!r}\n  truth:     {ex['truth']!r}\n  predicted: {ex['predicted']!r}")
    return summary


# --------------------------------------------------------------------------- shared


def _with_vocab(model_cfg, vocab_size: int, **ids):
    """The config with the tokenizer's vocabulary and special ids (they come from the data)."""
    return model_cfg.replace(vocab_size=vocab_size, **ids)


def _check_len(model_cfg, length: int) -> None:
    if model_cfg.position == "learned" and model_cfg.max_len < length:
        raise ValueError(f"max_len={model_cfg.max_len} is shorter than the sequence length {length}")


def _fit_numbers(fit_summary: dict) -> dict:
    return {"steps": fit_summary["steps"], "train_loss": fit_summary["train_loss"],
            "train_ms_per_step": fit_summary["ms_per_step"], "train_tokens_per_s": fit_summary["tokens_per_s"],
            "train_wall_s": fit_summary["wall_s"], "resumed_from": fit_summary["resumed_from"],
            "backend": jax.default_backend()}


def _finish(run_cfg, summary: dict, ylabel: str) -> None:
    run_dir = run_cfg.run_dir
    plot_loss_curve(run_dir / "metrics.jsonl", run_dir / "loss.png", ylabel=ylabel)
    write_json(run_dir / "summary.json", summary)


__all__ = ["TextRunConfig", "fill_masks", "fill_spans", "greedy_t5", "run_bert", "run_t5", "t5_decode",
           "tokenizer_from_meta"]
