"""Length extrapolation: one character-level GPT per position encoding, scored at 1x..16x its training length.

Every model is trained on windows of `train_len` characters and scored on the same
held-out characters at evaluation lengths W = m * train_len, in bits per character:

- non-overlapping: the held-out text is cut into windows of W; every target is scored,
  so early targets in a window have little context (the mean over context 0..W-1);
- sliding: windows of W advance by `stride`; the first window scores all its targets,
  each later one only its last `stride`, so (after the first window) every target sees
  at least W - stride characters of context (Press et al. 2022, "Train Short, Test Long").

Both score exactly the targets held_out[1 .. n_tokens]. A learned position table holds
`max_len = train_len` rows; at W > max_len the model refuses the input (it never clamps)
and the result is None, shown as n/a.

Beside the encodings themselves (rows named by encoding): `randomized` encodings are also
trained with Ruoss et al.'s random positions, drawn in evaluation too ("rope+random"), and every
trained rotary model (rope, xpos) is also scored, without retraining, with each of `rope_scalings`
at a factor equal to the length multiple ("rope/yarn": 4x the length at factor 4).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from txjax import GPT
from txjax.config import POSITIONS, ROTARY_POSITIONS, GPTConfig
from txjax.data import CharTokenizer, load_corpus
from txjax.ops.positions import ROPE_SCALINGS
from txjax.studies.common import (
    append_jsonl,
    bias_learned,
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
from txjax.studies.windows import bits_per_char
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, fresh_rngs, gpt_loss

METHODS = ("nonoverlapping", "sliding")
RANDOM_SUFFIX = "+random"


@dataclasses.dataclass(frozen=True)
class LengthStudyConfig:
    """What the length-extrapolation study trains, scores and writes."""

    corpus: str | None = None  # a UTF-8 file or txjax.data corpus name; None: the packaged excerpt (the script passes ../shared/data/tinyshakespeare.txt when it is beside the repo)
    positions: str = ",".join(POSITIONS)  # comma-separated position encodings to compare
    seeds: int = 3  # seeds per encoding (0 .. seeds-1); mean ± std over them
    train_len: int = 64  # L: training window, and the size of a learned position table
    multiples: str = "1,2,4,8,16"  # evaluation lengths as multiples of L
    stride: int | None = None  # sliding-window step; None: train_len // 2
    eval_tokens: int = 4096  # held-out targets scored at every length (rounded down to a multiple of the longest window)
    heldout_fraction: float = 0.1  # the last part of the corpus, never trained on
    eval_batch_tokens: int = 16384  # tokens per evaluation forward pass
    out_dir: str = "docs/results/length_extrapolation"  # where tables, plot and results.json go
    sinusoidal_scale: bool = True  # sinusoidal runs scale token embeddings by sqrt(D) as Vaswani et al. do (model flag scale_embeddings); without it the unit-scale sinusoids swamp embeddings of std 0.02
    randomized: str = ""  # comma list of encodings also trained with random positions (Ruoss et al. 2023), rows "<encoding>+random"; those not in positions are skipped
    random_max: int = 2048  # random positions are drawn from [0, random_max), in training and evaluation alike
    rope_scalings: str = ""  # comma list from ROPE_SCALINGS: each rope / xpos model is also scored with it at factor = the multiple, rows "<encoding>/<scaling>"

    def __post_init__(self):
        bad = [p for p in self.position_list if p not in POSITIONS]
        if bad or not self.position_list:
            raise ValueError(f"positions must be a comma list from {POSITIONS}, got {self.positions!r}")
        if self.seeds < 1 or self.train_len < 2 or self.eval_batch_tokens < 1:
            raise ValueError("seeds >= 1, train_len >= 2 and eval_batch_tokens >= 1 are required")
        if not self.multiple_list or min(self.multiple_list) < 1:
            raise ValueError(f"multiples must be positive ints, got {self.multiples!r}")
        if not 1 <= self.sliding_stride <= self.train_len:
            raise ValueError(f"stride must be in [1, train_len], got {self.stride}")
        if self.train_len % self.sliding_stride:
            raise ValueError(f"stride {self.sliding_stride} must divide train_len {self.train_len}")
        if self.eval_tokens < max(self.lengths):
            raise ValueError(f"eval_tokens={self.eval_tokens} is shorter than the longest window {max(self.lengths)}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if any(p not in POSITIONS for p in parse_list(self.randomized)):
            raise ValueError(f"randomized must be a comma list from {POSITIONS}, got {self.randomized!r}")
        if any(r not in ROPE_SCALINGS for r in parse_list(self.rope_scalings)):
            raise ValueError(f"rope_scalings must be a comma list from {ROPE_SCALINGS}, got {self.rope_scalings!r}")
        if self.randomized and self.random_max < max(self.lengths):
            raise ValueError(f"random_max={self.random_max} is below the longest window {max(self.lengths)}")

    @property
    def position_list(self) -> tuple[str, ...]:
        return parse_list(self.positions)

    @property
    def trained(self) -> tuple[str, ...]:
        """The variants that are trained: each encoding, then the "+random" form of those of them
        that `randomized` lists (so a study split by --positions randomizes each in its own part)."""
        randomized = parse_list(self.randomized)
        return self.position_list + tuple(p + RANDOM_SUFFIX for p in self.position_list if p in randomized)

    @property
    def multiple_list(self) -> tuple[int, ...]:
        return parse_list(self.multiples, int)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(m * self.train_len for m in self.multiple_list)

    @property
    def sliding_stride(self) -> int:
        return self.stride if self.stride is not None else max(1, self.train_len // 2)

    @property
    def scored_tokens(self) -> int:
        w = max(self.lengths)
        return self.eval_tokens // w * w


# --------------------------------------------------------------------------- the study


def corpus_ids(study: LengthStudyConfig) -> tuple[CharTokenizer, np.ndarray, np.ndarray, str]:
    """(tokenizer, train ids, held-out ids, corpus name): plain characters, no special tokens."""
    name = study.corpus if study.corpus is not None else "default"
    text = load_corpus(name)
    tok = CharTokenizer.from_corpus(text)
    ids = tok.encode(text).astype(np.int32)
    cut = int(len(ids) * (1.0 - study.heldout_fraction))
    return tok, ids[:cut], ids[cut:], name


def lm_batches(train_ids: np.ndarray, seq_len: int, batch_size: int, seed: int):
    """batch_fn(step) -> {inputs, targets}: random windows of seq_len + 1 characters, seeded by (seed, step)."""
    high = len(train_ids) - seq_len - 1
    if high < 1:
        raise ValueError(f"the training text ({len(train_ids)} chars) is shorter than a window of {seq_len + 1}")
    offsets = np.arange(seq_len + 1)

    def batch_fn(step: int):
        starts = np.random.default_rng([seed, step]).integers(0, high, batch_size)
        rows = train_ids[starts[:, None] + offsets[None, :]]
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}

    return batch_fn


def evaluate_model(logits_fn, config: GPTConfig, held_ids: np.ndarray, study: LengthStudyConfig,
                   multiples: tuple[int, ...] | None = None) -> list[dict]:
    """One row per (method, multiple) (all of the study's, or `multiples`): bits/char or None."""
    rows = []
    for m, w in zip(study.multiple_list, study.lengths):
        if multiples is not None and m not in multiples:
            continue
        for method in METHODS:
            stride = study.sliding_stride if method == "sliding" else None
            bpc = bits_per_char(logits_fn, config, held_ids, w, study.scored_tokens, stride,
                                study.eval_batch_tokens)
            rows.append({"method": method, "multiple": m, "length": w, "bits_per_char": bpc})
    return rows


def eval_logits(graphdef, rest):
    """jit(params, tokens, key) -> logits of the model `graphdef` describes, its RNG streams (random
    positions drawn in evaluation) rebuilt from `key`."""
    return jax.jit(lambda params, x, key: nnx.merge(graphdef, params, fresh_rngs(rest, key))(x))


RUN_KEY = ("position", "seed", "method", "multiple")


def run_study(model_cfg: GPTConfig, train_cfg: TrainConfig, study: LengthStudyConfig, log=print) -> dict:
    """Train and score every (encoding, seed); write results.json, the tables and the plot.

    Each finished (encoding, seed) is appended to out_dir/runs.jsonl at once and skipped
    when the study is started again, so a study can be resumed, or split across
    processes by --positions; the tables always cover every run in runs.jsonl.
    """
    started, revision = time.time(), git_revision()
    out = Path(study.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok, train_ids, held_ids, corpus = corpus_ids(study)
    if len(held_ids) < study.scored_tokens + 1:
        raise ValueError(f"held-out text has {len(held_ids)} chars; eval_tokens needs {study.scored_tokens + 1}")
    log(f"corpus {corpus}: {len(train_ids):,} train / {len(held_ids):,} held-out chars, vocab {tok.vocab_size}; "
        f"scoring {study.scored_tokens} chars at lengths {study.lengths}, sliding stride {study.sliding_stride}")
    done = done_runs(out / "runs.jsonl", ("position", "seed"))  # one run scores many rows
    steppers: dict = {}  # one compile per variant, reused by every seed
    scaled: dict = {}  # (variant, scaling, multiple) -> logits of the rope model with that scaling
    for seed in range(study.seeds):  # seed-major: every variant gets seed 0 before any gets seed 1
        for variant in study.trained:
            if (variant, seed) in done:
                continue
            position = variant.removesuffix(RANDOM_SUFFIX)
            randomized = variant != position
            cfg = model_cfg.replace(vocab_size=tok.vocab_size, max_len=study.train_len, position=position,
                                    scale_embeddings=model_cfg.scale_embeddings or (
                                        position == "sinusoidal" and study.sinusoidal_scale),
                                    random_positions=study.random_max if randomized else None,
                                    random_positions_eval=randomized)
            if variant not in steppers:
                stepper = Stepper(GPT(cfg), gpt_loss, train_cfg)
                steppers[variant] = (stepper, eval_logits(stepper.eval_graphdef, stepper.rest))
            stepper, logits_jit = steppers[variant]
            t0 = time.time()
            batch_fn = lm_batches(train_ids, study.train_len, train_cfg.batch_size, seed)
            state, summary = fit(stepper, stepper.init_state(init_params(GPT, cfg, seed)),
                                 map(batch_fn, itertools.count()), key=jax.random.key(seed))
            t_train = time.time() - t0
            learned = bias_learned(stepper.model(state.params))
            keys = itertools.count(10_000 * seed)  # a fresh draw of random positions per window batch

            def logits_with(fn):
                return lambda x: fn(state.params, x, jax.random.key(next(keys)))

            rows = [{"position": variant, **r} for r in evaluate_model(logits_with(logits_jit), cfg, held_ids, study)]
            for scaling in parse_list(study.rope_scalings) if position in ROTARY_POSITIONS and not randomized else ():
                for m in study.multiple_list:
                    if (variant, scaling, m) not in scaled:  # the same parameters under a stretched rotation
                        cfg_m = cfg.replace(rope_scaling=scaling, rope_scaling_factor=float(m))
                        scaled[(variant, scaling, m)] = eval_logits(Stepper(GPT(cfg_m), gpt_loss, train_cfg)
                                                                    .eval_graphdef, stepper.rest)
                    rows += [{"position": f"{position}/{scaling}", **r} for r in evaluate_model(
                        logits_with(scaled[(variant, scaling, m)]), cfg, held_ids, study, multiples=(m,))]
            t_eval = time.time() - t0 - t_train
            rows = [{"seed": seed, **r} for r in rows]
            rows.append({"position": variant, "seed": seed, "method": "train_loss_nats", "multiple": None,
                         "length": study.train_len, "bits_per_char": summary["train_loss"],
                         "train_s": round(t_train, 1), "eval_s": round(t_eval, 1), **learned})
            append_jsonl(out / "runs.jsonl", rows)
            shown = " ".join(f"{r['length']}:{'n/a' if r['bits_per_char'] is None else round(r['bits_per_char'], 3)}"
                             for r in rows if r["method"] == "sliding" and r["position"] == variant)
            log(f"{variant:>10} seed {seed}: train loss {summary['train_loss']:.3f} nats, train {t_train:.0f}s, "
                f"eval {t_eval:.0f}s; sliding bits/char {shown}")
    meta = {"corpus": corpus, "vocab_size": tok.vocab_size, "train_chars": int(len(train_ids)),
            "heldout_chars": int(len(held_ids)), "scored_chars": study.scored_tokens,
            "sliding_stride": study.sliding_stride,
            **run_metadata({"model": model_cfg, "train": train_cfg, "study": study}, started, revision)}
    append_jsonl(out / "parts.jsonl", [meta])
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY), "parts": read_jsonl(out / "parts.jsonl"), **meta}
    write_results(result, study)
    log(f"wrote {study.out_dir} in {meta['wall_s']:.0f}s (load average {meta['load_average_at_end']})")
    return result


def rebuild_tables(out_dir: str | Path) -> dict:
    """Rewrite results.json, the tables and the plot from out_dir/runs.jsonl without training
    (for a study stopped part-way, or split across processes)."""
    out = Path(out_dir)
    parts = read_jsonl(out / "parts.jsonl")
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY), "parts": parts,
              "rebuilt_from_runs_jsonl": True, "git_revision_of_rebuild": git_revision(),
              "load_average_at_rebuild": list(os.getloadavg())}
    if not result["runs"]:
        raise ValueError(f"no runs in {out / 'runs.jsonl'}")
    train_len = min(r["length"] for r in result["runs"] if r["multiple"] == 1)
    write_results(result, LengthStudyConfig(train_len=train_len, out_dir=str(out)))
    return result


# --------------------------------------------------------------------------- tables and plot


def summarize(runs: list[dict], positions, multiples) -> list[dict]:
    """Mean ± std over seeds per (encoding, method, multiple)."""
    out = []
    for method in METHODS:
        for p in positions:
            for m in multiples:
                vals = [r["bits_per_char"] for r in runs
                        if r["position"] == p and r["method"] == method and r["multiple"] == m]
                mean, std, n = mean_std(vals)
                out.append({"position": p, "method": method, "multiple": m,
                            "length": next((r["length"] for r in runs if r["multiple"] == m), None),
                            "mean_bits_per_char": mean, "std": std, "n_seeds": n,
                            "values": " ".join("n/a" if v is None else f"{v:.4f}" for v in vals)})
    return out


def markdown(summary: list[dict], positions, multiples, train_len: int) -> str:
    parts = []
    for method in METHODS:
        title = {"nonoverlapping": "Non-overlapping windows", "sliding": "Sliding window"}[method]
        header = ["encoding", "seeds"] + [f"{m}× ({m * train_len})" for m in multiples]
        rows = []
        for p in positions:
            mine = [r for r in summary if r["position"] == p and r["method"] == method]
            cells = {r["multiple"]: fmt_mean_std(r["mean_bits_per_char"], r["std"] if r["n_seeds"] > 1 else None)
                     for r in mine}
            rows.append([p, max(len(r["values"].split()) for r in mine)] + [cells[m] for m in multiples])
        parts.append(f"### {title}: held-out bits per character (mean ± std over seeds)\n\n"
                     + markdown_table(header, rows))
    return "\n".join(parts)


def write_results(result: dict, study: LengthStudyConfig) -> Path:
    present = {r["position"] for r in result["runs"]}
    positions = [v for p in POSITIONS for v in (p, p + RANDOM_SUFFIX, *(f"{p}/{s}" for s in ROPE_SCALINGS))
                 if v in present]
    multiples = sorted({r["multiple"] for r in result["runs"] if r["multiple"] is not None})
    summary = summarize(result["runs"], positions, multiples)
    runs = [{k: r.get(k) for k in ("position", "seed", "method", "multiple", "length",
                                   "bits_per_char", "train_s", "eval_s")} for r in result["runs"]]
    out = write_outputs(study.out_dir, result, summary, runs,
                        markdown(summary, positions, multiples, study.train_len))
    plot(summary, positions, study.train_len, out / "length_extrapolation.png")
    return out


def plot(summary: list[dict], positions, train_len: int, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, method in zip(axes, METHODS):
        for p in positions:
            rows = [r for r in summary if r["position"] == p and r["method"] == method
                    and r["mean_bits_per_char"] is not None]
            if rows:
                ax.errorbar([r["length"] for r in rows], [r["mean_bits_per_char"] for r in rows],
                            yerr=[r["std"] for r in rows], marker="o", capsize=3, label=p)
        ax.axvline(train_len, color="gray", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (characters)")
        ax.set_title(f"{method.replace('nonoverlapping', 'non-overlapping')} windows (train length {train_len})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out bits per character")
    axes[1].legend(fontsize=8)
    all_vals = [r["mean_bits_per_char"] for r in summary if r["mean_bits_per_char"] is not None]
    if all_vals:  # blown-up encodings would hide the differences that matter
        lo, hi = min(all_vals), max(all_vals)
        axes[0].set_ylim(lo - 0.1, min(hi + 0.1, lo + 3.0))
        if hi + 0.1 > lo + 3.0:
            fig.text(0.01, 0.01, "y axis clipped: some points lie above it (see table.md)", fontsize=7)
    if "learned" in positions:
        fig.text(0.5, 0.01, "learned: n/a beyond its table of train-length positions (never clamped)",
                 fontsize=7, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
