"""Copy and reverse, in the manner of Kazemnejad et al. 2023 ("The Impact of Positional Encoding
on Length Generalization in Transformers"): train on lengths 4..20, test on 21..40, exact match.

The decoder-only model (GPT) reads `BOS x SEP y EOS`; the encoder-decoder (T5) encodes `x EOS`
and decodes `PAD y`; both are scored on `y EOS` (rows and read-outs: `synthetic_data`).

Exact match is measured by teacher forcing: an example counts when the argmax at every
scored position equals the target. By induction this is exactly "greedy decoding
reproduces y EOS", at the cost of one forward pass. A learned position table holds the
longest training sequence; longer test sequences are reported as n/a, never clamped.

The out-of-distribution column means something only for a model that has learned the task: each
run trains until its in-distribution exact match, checked every `check_every` steps on held-out
examples, reaches `target_exact` (or the step budget runs out) and records the steps it took.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import jax
import numpy as np

from txjax import GPT, T5
from txjax.config import POSITIONS, GPTConfig, T5Config, positions_for
from txjax.studies.common import (
    append_jsonl,
    check_dtype,
    done_runs,
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
from txjax.studies.synthetic_data import (
    BATCHERS,
    EOS,
    NUM_SPECIAL,
    PAD,
    TASKS,
    accuracy_by_index,
    decoder_only_batch,
    exact_by_length,
    exact_match,
    match_by_distance,
    match_by_source_offset,
    sample_inputs,
)
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, gpt_loss, t5_loss

FAMILIES = ("gpt", "t5")


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Copy / reverse: tasks, lengths, model size, and what is compared."""

    tasks: str = "copy,reverse"  # comma list from copy, reverse
    families: str = "gpt,t5"  # gpt: decoder-only; t5: encoder-decoder
    positions: str = ",".join(POSITIONS)  # comma list of position encodings
    seeds: int = 3  # seeds per (task, family, encoding)
    num_symbols: int = 20  # size of the symbol alphabet (4 special ids come on top)
    train_min: int = 4  # shortest training input
    train_max: int = 20  # longest training input
    test_min: int = 21  # shortest out-of-distribution test input
    test_max: int = 40  # longest out-of-distribution test input
    eval_examples: int = 512  # test examples per split (in / out of distribution)
    target_exact: float = 0.95  # train until in-distribution exact match reaches this (Kazemnejad et al.'s bar)
    check_every: int = 250  # steps between those checks; 0: no checks, train every step of the budget
    check_examples: int = 256  # held-out in-distribution examples per check (not the test examples)
    d_model: int = 64  # D of both families
    num_heads: int = 4  # N
    num_layers: int = 2  # blocks (T5: per stack)
    d_ff: int = 256  # F
    dtype: str = "float32"  # of the matmuls and activations (ModelConfig.dtype); bfloat16 runs them on the CPU's matrix units
    out_dir: str = "docs/results/synthetic"  # where tables, plot and results.json go
    sinusoidal_scale: bool = True  # sinusoidal runs scale token embeddings by sqrt(D) as Vaswani et al. do (model flag scale_embeddings)
    num_buckets: int = 32  # T5 bias runs: relative-position buckets (the first half exact, then log-spaced)
    max_distance: int = 128  # T5 bias runs: offsets from here on share the last bucket
    prefix_max: int = 0  # gpt only: training rows start with 0..prefix_max random symbols (attended, unscored), so a query sees a varying number of keys; checks and tests have none

    def __post_init__(self):
        for name, allowed in (("tasks", TASKS), ("families", FAMILIES), ("positions", POSITIONS)):
            items = parse_list(getattr(self, name))
            if not items or any(x not in allowed for x in items):
                raise ValueError(f"{name} must be a comma list from {allowed}, got {getattr(self, name)!r}")
        if not 1 <= self.train_min <= self.train_max or not 1 <= self.test_min <= self.test_max:
            raise ValueError("lengths must satisfy 1 <= min <= max")
        if self.num_symbols < 2 or self.seeds < 1 or self.eval_examples < 1 or self.check_examples < 1:
            raise ValueError("num_symbols >= 2, seeds >= 1, eval_examples >= 1 and check_examples >= 1 are required")
        if self.check_every < 0 or not 0.0 < self.target_exact <= 1.0 or self.prefix_max < 0:
            raise ValueError("check_every >= 0, 0 < target_exact <= 1 and prefix_max >= 0 are required")
        check_dtype(self.dtype)
        if self.prefix_max and parse_list(self.families) != ("gpt",):
            raise ValueError("prefix_max applies to decoder-only rows: use it with families='gpt'")

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + self.num_symbols


def model_config(family: str, position: str, study: SyntheticConfig):
    """The family's config at the study's size; a learned table holds the longest training sequence."""
    size = dict(vocab_size=study.vocab_size, d_model=study.d_model, num_heads=study.num_heads,
                num_layers=study.num_layers, d_ff=study.d_ff, position=position,
                scale_embeddings=position == "sinusoidal" and study.sinusoidal_scale,
                num_buckets=study.num_buckets, max_distance=study.max_distance, dtype=study.dtype)
    if family == "gpt":
        return GPTConfig(max_len=study.prefix_max + 2 * study.train_max + 2, **size)
    return T5Config(max_len=study.train_max + 1, pad_id=PAD, eos_id=EOS, decoder_start_id=PAD, **size)


def fits_table(config, batch: dict[str, np.ndarray]) -> bool:
    """False when a learned position table is shorter than the batch's sequences."""
    if config.position != "learned":
        return True
    return max(v.shape[1] for v in batch.values()) <= config.max_len


def score(logits_fn, params, batch: dict[str, np.ndarray], chunk: int = 128) -> tuple[np.ndarray, ...]:
    """Per-example (exact match, token accuracy) of a batch and its argmax predictions [B, T],
    `chunk` rows per forward pass."""
    chunks = ({k: v[i: i + chunk] for k, v in batch.items()} for i in range(0, len(batch["targets"]), chunk))
    pred_BT = np.concatenate([np.argmax(np.asarray(logits_fn(params, b)), -1) for b in chunks])
    return (*exact_match(pred_BT, batch["targets"]), pred_BT)


def run_one(family: str, task: str, position: str, seed: int, study: SyntheticConfig,
            train_cfg: TrainConfig, stepper_cache: dict) -> dict:
    """Train one model until it reaches `target_exact` in distribution (or the budget ends); score it
    in and out of distribution."""
    cfg = model_config(family, position, study)
    model_cls, loss = (GPT, gpt_loss) if family == "gpt" else (T5, t5_loss)
    key = (family, position)
    if key not in stepper_cache:  # one compile per architecture, reused across tasks and seeds
        stepper = Stepper(model_cls(cfg), loss, train_cfg)
        fwd = (lambda p, b: stepper.model(p)(b["inputs"])) if family == "gpt" else \
              (lambda p, b: stepper.model(p)(b["enc_inputs"], b["dec_inputs"]))
        stepper_cache[key] = (stepper, jax.jit(fwd))
    stepper, logits_fn = stepper_cache[key]
    batcher = BATCHERS[family]

    def batch_fn(step):
        rng = np.random.default_rng([seed, step, TASKS.index(task)])
        xs = sample_inputs(rng, train_cfg.batch_size, study.train_min, study.train_max, study.num_symbols)
        if study.prefix_max:  # SyntheticConfig allows it with families="gpt" only
            prefixes = sample_inputs(rng, len(xs), 0, study.prefix_max, study.num_symbols)
            return decoder_only_batch(task, xs, study.train_max, prefixes, study.prefix_max)
        return batcher(task, xs, study.train_max)

    check = batcher(task, sample_inputs(np.random.default_rng([20_000 + seed, TASKS.index(task)]),
                                        study.check_examples, study.train_min, study.train_max,
                                        study.num_symbols), study.train_max)
    t0 = time.time()
    state, batches = stepper.init_state(init_params(model_cls, cfg, seed)), map(batch_fn, itertools.count())
    every = study.check_every or train_cfg.steps
    curve, steps_to_target, done = [], None, 0
    while done < train_cfg.steps and steps_to_target is None:
        state, summary = fit(stepper, state, batches, start_step=done, stop_at=done + every,
                             key=jax.random.key(seed))
        done = min(done + every, train_cfg.steps)
        if study.check_every:
            curve.append([done, float(score(logits_fn, state.params, check)[0].mean())])
            steps_to_target = done if curve[-1][1] >= study.target_exact else None
    out = {"family": family, "task": task, "position": position, "seed": seed,
           "train_loss": summary["train_loss"], "steps": done, "steps_to_target": steps_to_target,
           "check_curve": curve, "train_s": round(time.time() - t0, 1)}
    rng = np.random.default_rng([10_000 + seed, TASKS.index(task)])  # same test sets for every encoding
    for split, lo, hi in (("in", study.train_min, study.train_max), ("out", study.test_min, study.test_max)):
        xs = sample_inputs(rng, study.eval_examples, lo, hi, study.num_symbols)
        batch = batcher(task, xs, hi)
        if not fits_table(cfg, {k: v for k, v in batch.items() if k != "targets"}):
            out[f"{split}_exact"], out[f"{split}_token_acc"] = None, None
            continue
        exact, tok, pred = score(logits_fn, state.params, batch)
        out[f"{split}_exact"], out[f"{split}_token_acc"] = float(exact.mean()), float(tok.mean())
        lengths = [len(x) for x in xs]
        out[f"{split}_exact_by_length"] = exact_by_length(exact, lengths)
        out[f"{split}_accuracy_by_index"] = accuracy_by_index(pred, batch["targets"], lengths)
        if family == "gpt":
            out[f"{split}_match_by_distance"] = match_by_distance(pred, batch["inputs"], batch["targets"], lengths)
            out[f"{split}_match_by_source_offset"] = match_by_source_offset(task, pred, batch["inputs"], lengths)
    return out


RUN_KEY = ("family", "task", "position", "seed")


def run_study(train_cfg: TrainConfig, study: SyntheticConfig, log=print) -> dict:
    """Every (family, task, encoding, seed) not yet in out_dir/runs.jsonl, seed-major; then the tables.

    Each finished run is appended to runs.jsonl at once, so a stopped study resumes and a study
    can be split across processes by --families, --tasks or --positions."""
    started, revision = time.time(), git_revision()
    out = Path(study.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = done_runs(out / "runs.jsonl", RUN_KEY)
    cache: dict = {}
    for seed in range(study.seeds):
        for family in parse_list(study.families):
            for task in parse_list(study.tasks):
                for position in (p for p in parse_list(study.positions) if p in positions_for(family)):
                    if (family, task, position, seed) in done:
                        continue
                    r = run_one(family, task, position, seed, study, train_cfg, cache)
                    append_jsonl(out / "runs.jsonl", [r])
                    log(f"{family} {task:>7} {position:>10} seed {seed}: loss {r['train_loss']:.3f} "
                        f"({r['train_s']:.0f}s, {r['steps']} steps, {study.target_exact:.0%} "
                        f"{'at ' + str(r['steps_to_target']) if r['steps_to_target'] else 'not reached'}) "
                        f"exact in {_pct(r['in_exact'])} out {_pct(r['out_exact'])}")
    meta = run_metadata({"train": train_cfg, "study": study}, started, revision)
    append_jsonl(out / "parts.jsonl", [meta])
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY), "parts": read_jsonl(out / "parts.jsonl"), **meta}
    write_results(result, study)
    log(f"wrote {study.out_dir} in {meta['wall_s']:.0f}s (load average {meta['load_average_at_end']})")
    return result


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def summarize(runs: list[dict]) -> list[dict]:
    """Mean ± std over seeds per (family, task, encoding); how many seeds reached the target and
    the mean steps those took."""
    out = []
    for family, task, position in dict.fromkeys((r["family"], r["task"], r["position"]) for r in runs):
        rs = [r for r in runs if (r["family"], r["task"], r["position"]) == (family, task, position)]
        row = {"family": family, "task": task, "position": position, "n_seeds": len(rs)}
        for split in ("in", "out"):
            for metric in ("exact", "token_acc"):
                m, s, _ = mean_std([r[f"{split}_{metric}"] for r in rs])
                row[f"{split}_{metric}_mean"], row[f"{split}_{metric}_std"] = m, s
        reached = [r["steps_to_target"] for r in rs if r.get("steps_to_target")]
        row["n_reached"] = len(reached)
        row["steps_to_target_mean"] = float(np.mean(reached)) if reached else None
        out.append(row)
    return out


def markdown(summary: list[dict], study: SyntheticConfig) -> str:
    def cell(row, split):
        m, s = row[f"{split}_exact_mean"], row[f"{split}_exact_std"]
        if m is None:
            return "n/a"
        return f"{100 * m:.1f}" + (f" ± {100 * s:.1f}" if row["n_seeds"] > 1 else "")

    def steps(row):
        mean = row["steps_to_target_mean"]
        return f"{row['n_reached']}/{row['n_seeds']}" + (f" · {mean:,.0f}" if mean is not None else "")

    target = f"{study.target_exact:.0%}"
    parts = []
    for family in dict.fromkeys(r["family"] for r in summary):
        name = {"gpt": "Decoder-only (GPT)", "t5": "Encoder-decoder (T5)"}[family]
        tasks = list(dict.fromkeys(r["task"] for r in summary if r["family"] == family))
        header = ["encoding"] + [f"{t} {s}" for t in tasks for s in (
            f"in ({study.train_min}–{study.train_max})", f"out ({study.test_min}–{study.test_max})",
            f"seeds at {target} · steps")]
        rows = []
        for p in dict.fromkeys(r["position"] for r in summary if r["family"] == family):
            cells = [p]
            for t in tasks:
                row = next((r for r in summary if (r["family"], r["task"], r["position"]) == (family, t, p)), None)
                cells += ["–"] * 3 if row is None else [cell(row, "in"), cell(row, "out"), steps(row)]
            rows.append(cells)
        parts.append(f"### {name}: exact-match accuracy (%), mean ± std over seeds\n\n"
                     + markdown_table(header, rows))
    note = (f"\nA run stops when its in-distribution exact match on {study.check_examples} held-out examples "
            f"reaches {target} (checked every {study.check_every} steps); 'seeds at {target} · steps' counts "
            "the seeds that got there and their mean steps. Out-of-distribution cells of rows whose seeds "
            "did not all get there read an under-trained model.\n") if study.check_every else ""
    return "\n".join(parts) + note


def write_results(result: dict, study: SyntheticConfig) -> Path:
    summary = summarize(result["runs"])
    out = write_outputs(study.out_dir, result, summary,
                        [{k: v for k, v in r.items() if k != "check_curve" and "_by_" not in k}
                         for r in result["runs"]],
                        markdown(summary, study))
    plot(summary, out / "synthetic.png")
    return out


def plot(summary: list[dict], path: Path) -> Path:
    plt = pyplot()
    panels = list(dict.fromkeys((r["family"], r["task"]) for r in summary))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), sharey=True, squeeze=False)
    for ax, (family, task) in zip(axes[0], panels):
        rows = [r for r in summary if (r["family"], r["task"]) == (family, task)]
        x = np.arange(len(rows))
        for j, (split, label) in enumerate((("in", "in distribution"), ("out", "out of distribution"))):
            vals = [np.nan if r[f"{split}_exact_mean"] is None else 100 * r[f"{split}_exact_mean"] for r in rows]
            ax.bar(x + (j - 0.5) * 0.4, vals, 0.4, label=label)
        for i, r in enumerate(rows):
            if r["out_exact_mean"] is None:
                ax.text(i + 0.2, 2, "n/a", ha="center", fontsize=7, rotation=90)
        ax.set_xticks(x, [r["position"] for r in rows], rotation=45, fontsize=8)
        ax.set_title(f"{family} {task}")
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("exact match (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
