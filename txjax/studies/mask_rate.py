"""Masking rate: BERT MLM and T5 span corruption trained at several rates, scored on one fixed 15% task.

Answers the course notes' open question "what happens if you increase or decrease
p_mask". Every model of a family is scored on the same held-out examples, masked once
at 15% (BERT: 80/10/10 [MASK]/random/keep; T5: noise density 0.15, mean span 3) with a
fixed seed, whatever rate it was trained at, and again on the same held-out text masked at
its own rate (the task it was trained for; Wettig et al. 2023 report both). Also reported: the
tokens that carry a loss per training step (BERT: masked positions; T5: target tokens,
sentinels and EOS included), the signal each rate buys per step.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import jax
import numpy as np

from txjax import Bert, T5
from txjax.config import BertConfig, T5Config
from txjax.data import BatchIterator, IGNORE_INDEX, pack_tokens
from txjax.studies.common import (
    append_jsonl,
    check_dtype,
    done_runs,
    fmt_mean_std,
    git_revision,
    init_params,
    markdown_table,
    mean_std,
    parse_list,
    pyplot,
    read_jsonl,
    run_metadata,
    unique_runs,
    write_outputs,
)
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, bert_loss, t5_loss
from txjax.tasks.mlm import bert_rows, mlm_transform
from txjax.tasks.spans import span_transform, t5_lengths
from txjax.tasks.text import TextRunConfig, corpus_split

FAMILIES = ("bert", "t5")
EVAL_RATE = 0.15


@dataclasses.dataclass(frozen=True)
class MaskRateConfig:
    """Which rates and families, the model size, and the fixed held-out task."""

    rates: str = "0.05,0.15,0.3,0.5"  # training masking rates (BERT) / noise densities (T5)
    families: str = "bert,t5"  # comma list from bert, t5
    seeds: int = 3  # seeds per (family, rate)
    corpus: str | None = None  # a UTF-8 file or txjax.data corpus name; None: the packaged excerpt (the script passes ../shared/data/tinyshakespeare.txt when it is beside the repo)
    seq_len: int = 64  # BERT: tokens per row with [CLS] and [SEP]; T5: encoder length
    mean_span: float = 3.0  # T5: mean corrupted-span length
    num_sentinels: int = 32  # T5: sentinel ids
    heldout_examples: int = 512  # held-out examples in the fixed 15% task
    finetune_steps: int = 0  # > 0: each trained model then trains this many steps on the 15% task and is scored on it again (Raffel et al. fine-tune before they score)
    finetune_learning_rate: float = 1e-3  # constant, no warmup (Raffel et al. fine-tune at a constant 1e-3); the rest of the optimizer as in training
    d_model: int = 64  # D of both families
    num_heads: int = 4  # N
    num_layers: int = 2  # blocks (T5: per stack)
    d_ff: int = 256  # F
    dtype: str = "float32"  # of both families' matmuls and activations (ModelConfig.dtype); bfloat16 runs them on the CPU's matrix units
    out_dir: str = "docs/results/mask_rate"  # where tables, plot and results.json go

    def __post_init__(self):
        fams = parse_list(self.families)
        if not fams or any(f not in FAMILIES for f in fams):
            raise ValueError(f"families must be a comma list from {FAMILIES}, got {self.families!r}")
        rates = parse_list(self.rates, float)
        if not rates or any(not 0.0 < r < 1.0 for r in rates):
            raise ValueError(f"rates must be in (0, 1), got {self.rates!r}")
        if self.seeds < 1 or self.seq_len < 8 or self.heldout_examples < 1:
            raise ValueError("seeds >= 1, seq_len >= 8 and heldout_examples >= 1 are required")
        if self.finetune_steps < 0 or self.finetune_learning_rate <= 0:
            raise ValueError("finetune_steps >= 0 and finetune_learning_rate > 0 are required")
        check_dtype(self.dtype)

    def text_config(self, rate: float) -> TextRunConfig:
        """The txjax.tasks.text settings that build this rate's data."""
        return TextRunConfig(corpus=self.corpus, seq_len=self.seq_len, mask_rate=rate, mean_span=self.mean_span,
                             num_sentinels=self.num_sentinels, heldout_examples=self.heldout_examples)

    def model_kwargs(self) -> dict:
        """The fields both families' model configs take from this one."""
        return dict(d_model=self.d_model, num_heads=self.num_heads, num_layers=self.num_layers, d_ff=self.d_ff,
                    dtype=self.dtype)


def loss_tokens(batch: dict) -> int:
    """Tokens that carry a loss in a batch (targets that are not -100)."""
    return int((np.asarray(batch["targets"]) != IGNORE_INDEX).sum())


def family_data(family: str, study: MaskRateConfig):
    """(model class, loss, config, held_at(rate), make_batches(rate, seed, batch_size)) for a family.

    held_at(rate): the held-out rows masked at `rate` with a fixed seed; held_at(EVAL_RATE) is
    the fixed task every model of the family is scored on."""
    eval_cfg = study.text_config(EVAL_RATE)
    if family == "bert":
        tok, train_ids, held_ids, _ = corpus_split(eval_cfg, "bert")
        cfg = BertConfig(vocab_size=tok.vocab_size, max_len=study.seq_len, pad_id=tok.pad_id, **study.model_kwargs())
        train_rows = bert_rows(train_ids, tok, study.seq_len)
        held_rows = bert_rows(held_ids, tok, study.seq_len)[: study.heldout_examples]

        def held_at(rate):
            return mlm_transform(tok, rate)(held_rows, np.random.default_rng(1234))

        def make_batches(rate, seed, batch_size):
            return BatchIterator(train_rows, batch_size, seed=seed, transform=mlm_transform(tok, rate))

        return Bert, bert_loss, cfg, held_at, make_batches
    tok, train_ids, held_ids, _ = corpus_split(eval_cfg, "t5", study.num_sentinels)
    cfg = T5Config(vocab_size=tok.vocab_size, max_len=study.seq_len, pad_id=tok.pad_id, eos_id=tok.eos_id,
                   decoder_start_id=tok.pad_id, **study.model_kwargs())

    def held_at(rate):  # a rate's rows are as long as its corrupted inputs fill seq_len
        run_cfg = study.text_config(rate)
        rows = pack_tokens(held_ids, t5_lengths(run_cfg)[0])[: study.heldout_examples]
        return span_transform(tok, run_cfg)(rows, np.random.default_rng(1234))

    def make_batches(rate, seed, batch_size):
        run_cfg = study.text_config(rate)
        raw_len, _ = t5_lengths(run_cfg)
        return BatchIterator(pack_tokens(train_ids, raw_len), batch_size, seed=seed,
                             transform=span_transform(tok, run_cfg))

    return T5, t5_loss, cfg, held_at, make_batches


def batches_of(held: dict, size: int = 64) -> list[dict]:
    n = len(held["targets"])
    return [{k: v[i: i + size] for k, v in held.items()} for i in range(0, n - size + 1, size)] or [held]


RUN_KEY = ("family", "rate", "seed")
FINETUNE_SEED = 10_000  # offsets the fine-tune's data order and key from training's
SCORES = ("heldout_loss", "heldout_accuracy", "own_rate_loss", "own_rate_accuracy")
FINETUNED = ("finetuned_loss", "finetuned_accuracy")  # at 15% after `finetune_steps` more on it


def finetune_config(train_cfg: TrainConfig, study: MaskRateConfig) -> TrainConfig:
    """Training's optimizer for `finetune_steps` at a constant `finetune_learning_rate`."""
    return dataclasses.replace(train_cfg, steps=max(study.finetune_steps, 1), warmup_steps=0, min_lr_ratio=1.0,
                               learning_rate=study.finetune_learning_rate)


def run_study(train_cfg: TrainConfig, study: MaskRateConfig, log=print) -> dict:
    """Train every (family, rate, seed) not yet in out_dir/runs.jsonl, seed-major; score each on the
    fixed 15% task and at its own rate; then the tables. A stopped study resumes; a study can be
    split across processes by --families or --rates."""
    started, revision = time.time(), git_revision()
    out = Path(study.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = done_runs(out / "runs.jsonl", RUN_KEY)
    families = {}
    for seed in range(study.seeds):
        for family in parse_list(study.families):
            for rate in parse_list(study.rates, float):
                if (family, rate, seed) in done:
                    continue
                if family not in families:  # one compile per family
                    model_cls, loss_fn, cfg, held_at, make_batches = family_data(family, study)
                    families[family] = (Stepper(model_cls(cfg), loss_fn, train_cfg), model_cls, cfg, held_at,
                                        make_batches, batches_of(held_at(EVAL_RATE)),
                                        Stepper(model_cls(cfg), loss_fn, finetune_config(train_cfg, study))
                                        if study.finetune_steps else None)
                stepper, model_cls, cfg, held_at, make_batches, held15, tuner = families[family]
                it = make_batches(rate, seed, train_cfg.batch_size)
                counts = []

                def batch_fn(step):
                    b = next(it)
                    counts.append(loss_tokens(b))
                    return b

                t0 = time.time()
                state, summary = fit(stepper, stepper.init_state(init_params(model_cls, cfg, seed)),
                                     map(batch_fn, itertools.count()), key=jax.random.key(seed))
                ev = stepper.evaluate(state.params, held15)
                own = ev if rate == EVAL_RATE else stepper.evaluate(state.params, batches_of(held_at(rate)))
                r = {"family": family, "rate": rate, "seed": seed, "heldout_loss": ev["loss"],
                     "heldout_accuracy": ev["accuracy"], "heldout_tokens": ev["tokens"],
                     "own_rate_loss": own["loss"], "own_rate_accuracy": own["accuracy"],
                     "predicted_tokens_per_step": float(np.mean(counts)), "train_loss": summary["train_loss"]}
                if study.finetune_steps:  # a fresh optimizer on the trained weights, the 15% task's batches
                    tuned, _ = fit(tuner, tuner.init_state(state.params),
                                   iter(make_batches(EVAL_RATE, seed + FINETUNE_SEED, train_cfg.batch_size)),
                                   key=jax.random.key(seed + FINETUNE_SEED))
                    ft = stepper.evaluate(tuned.params, held15)  # the same model: training's compiled eval step
                    r.update(finetuned_loss=ft["loss"], finetuned_accuracy=ft["accuracy"])
                r["wall_s"] = round(time.time() - t0, 1)
                append_jsonl(out / "runs.jsonl", [r])
                log(f"{family} p={rate:.2f} seed {seed}: held-out@15% loss {r['heldout_loss']:.3f} "
                    f"acc {r['heldout_accuracy']:.3f}; @own p loss {r['own_rate_loss']:.3f} acc "
                    f"{r['own_rate_accuracy']:.3f}; {r['predicted_tokens_per_step']:.0f} predicted tokens/step"
                    + (f"; fine-tuned@15% loss {r['finetuned_loss']:.3f} acc {r['finetuned_accuracy']:.3f}"
                       if study.finetune_steps else "") + f" ({r['wall_s']:.0f}s)")
    meta = run_metadata({"train": train_cfg, "study": study}, started, revision)
    append_jsonl(out / "parts.jsonl", [meta])
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY), "parts": read_jsonl(out / "parts.jsonl"),
              "eval_rate": EVAL_RATE, **meta}
    write_results(result, study)
    log(f"wrote {study.out_dir} in {meta['wall_s']:.0f}s (load average {meta['load_average_at_end']})")
    return result


def summarize(runs: list[dict]) -> list[dict]:
    out = []
    scores = (*SCORES, *(FINETUNED if any(FINETUNED[0] in r for r in runs) else ()))
    for family in dict.fromkeys(r["family"] for r in runs):
        for rate in dict.fromkeys(r["rate"] for r in runs if r["family"] == family):
            rs = [r for r in runs if r["family"] == family and r["rate"] == rate]
            row = {"family": family, "train_rate": rate, "n_seeds": len(rs)}
            for k in (*scores, "predicted_tokens_per_step", "train_loss"):
                row[f"{k}_mean"], row[f"{k}_std"], _ = mean_std([r.get(k) for r in rs])
            out.append(row)
    return out


def markdown(summary: list[dict]) -> str:
    """The table; with fine-tuned runs, their scores at 15% as two more columns."""
    scores = [*SCORES, *(FINETUNED if summary and "finetuned_loss_mean" in summary[0] else ())]
    header = ["family", "train p", "seeds", "held-out loss @15% (nats)", "held-out accuracy @15%",
              "held-out loss @own p", "held-out accuracy @own p",
              *(["loss @15% after fine-tuning on it", "accuracy @15% after fine-tuning"] if len(scores) > 4 else []),
              "predicted tokens / step", "final train loss (at own p)"]
    one = lambda r, k: None if r["n_seeds"] == 1 else r[k]  # noqa: E731 - no "± 0" for a single seed
    rows = [[r["family"], f"{r['train_rate']:.2f}", r["n_seeds"]]
            + [fmt_mean_std(r[f"{k}_mean"], one(r, f"{k}_std")) if r[f"{k}_mean"] is not None else "–"
               for k in scores]
            + [f"{r['predicted_tokens_per_step_mean']:.0f}", f"{r['train_loss_mean']:.3f}"] for r in summary]
    return ("### Held-out loss and accuracy on one fixed 15% task and at each model's own rate "
            "(mean ± std over seeds; one seed: the value)\n\n" + markdown_table(header, rows))


def rebuild_tables(out_dir: str | Path) -> Path:
    """Rewrite results.json, the tables and the plot from out_dir/runs.jsonl (no training)."""
    out = Path(out_dir)
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY), "parts": read_jsonl(out / "parts.jsonl"),
              "eval_rate": EVAL_RATE, "rebuilt_from_runs_jsonl": True}
    return write_results(result, MaskRateConfig(out_dir=str(out)))


def write_results(result: dict, study: MaskRateConfig) -> Path:
    summary = summarize(result["runs"])
    out = write_outputs(study.out_dir, result, summary, result["runs"], markdown(summary))
    plot(summary, out / "mask_rate.png")
    return out


def plot(summary: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for family in dict.fromkeys(r["family"] for r in summary):
        rows = [r for r in summary if r["family"] == family]
        x = [r["train_rate"] for r in rows]
        for ax, key in zip(axes, ("heldout_loss", "heldout_accuracy", "predicted_tokens_per_step")):
            ax.errorbar(x, [r[f"{key}_mean"] for r in rows], yerr=[r[f"{key}_std"] for r in rows],
                        marker="o", capsize=3, label=family)
    for ax, title in zip(axes, ("held-out loss at 15% (nats/token)", "held-out accuracy at 15%",
                                "tokens with a loss per step")):
        ax.set_xlabel("training masking rate p")
        ax.set_title(title, fontsize=9)
        ax.axvline(EVAL_RATE, color="gray", ls=":", lw=1)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
