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
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from txjax import GPT
from txjax.config import POSITIONS, GPTConfig
from txjax.data import CharTokenizer, load_corpus
from txjax.studies.common import (
    fmt_mean_std,
    git_revision,
    init_params,
    markdown_table,
    mean_std,
    parse_list,
    pyplot,
    run_metadata,
    write_outputs,
)
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, gpt_loss

METHODS = ("nonoverlapping", "sliding")
LN2 = math.log(2.0)


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

    @property
    def position_list(self) -> tuple[str, ...]:
        return parse_list(self.positions)

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


# --------------------------------------------------------------------------- windows


def nonoverlapping_windows(ids: np.ndarray, window: int, n_tokens: int):
    """(inputs_NW, targets_NW, scored_NW) cutting ids[0 .. n_tokens] into n_tokens / window windows."""
    if n_tokens % window or n_tokens + 1 > len(ids):
        raise ValueError(f"need n_tokens ({n_tokens}) divisible by window ({window}) and <= len(ids) - 1")
    inputs = ids[:n_tokens].reshape(-1, window)
    targets = ids[1: n_tokens + 1].reshape(-1, window)
    return inputs, targets, np.ones(inputs.shape, bool)


def sliding_windows(ids: np.ndarray, window: int, stride: int, n_tokens: int):
    """(inputs_NW, targets_NW, scored_NW): windows every `stride`; the first scores all, the rest their last `stride`.

    Every target ids[1 .. n_tokens] is scored exactly once.
    """
    if window > n_tokens or (n_tokens - window) % stride or n_tokens + 1 > len(ids) or not 1 <= stride <= window:
        raise ValueError(f"window {window}, stride {stride} do not tile {n_tokens} tokens of {len(ids)}")
    starts = np.arange(0, n_tokens - window + 1, stride)
    offsets = np.arange(window)
    inputs = ids[starts[:, None] + offsets[None, :]]
    targets = ids[starts[:, None] + offsets[None, :] + 1]
    scored = np.zeros(inputs.shape, bool)
    scored[0] = True
    scored[1:, window - stride:] = True
    return inputs, targets, scored


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scored_bits(logits_fn: Callable, inputs_NW: np.ndarray, targets_NW: np.ndarray, scored_NW: np.ndarray,
                batch: int) -> float:
    """Mean bits per scored target; batches are padded to `batch` rows so one compile serves all."""
    total, count = 0.0, 0
    for i in range(0, len(inputs_NW), batch):
        x = inputs_NW[i: i + batch]
        n = len(x)
        if n < batch:
            x = np.concatenate([x, np.repeat(x[-1:], batch - n, axis=0)])
        logp_BWV = log_softmax(np.asarray(logits_fn(x.astype(np.int32))))[:n]
        nll_BW = -np.take_along_axis(logp_BWV, targets_NW[i: i + n, :, None].astype(np.int64), axis=-1)[..., 0]
        total += float(nll_BW[scored_NW[i: i + n]].sum())
        count += int(scored_NW[i: i + n].sum())
    return total / count / LN2


def bits_per_char(logits_fn: Callable, config: GPTConfig, ids: np.ndarray, window: int, n_tokens: int,
                  stride: int | None = None, batch_tokens: int = 16384) -> float | None:
    """Held-out bits/char at `window` (sliding when `stride` is given); None where a learned table is too short."""
    if config.position == "learned" and window > config.max_len:
        return None
    if stride is None:
        arrays = nonoverlapping_windows(ids, window, n_tokens)
    else:
        arrays = sliding_windows(ids, window, stride, n_tokens)
    return scored_bits(logits_fn, *arrays, batch=max(1, batch_tokens // window))


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


def evaluate_model(logits_fn, config: GPTConfig, held_ids: np.ndarray, study: LengthStudyConfig) -> list[dict]:
    """One row per (method, multiple): bits/char or None."""
    rows = []
    for m, w in zip(study.multiple_list, study.lengths):
        for method in METHODS:
            stride = study.sliding_stride if method == "sliding" else None
            bpc = bits_per_char(logits_fn, config, held_ids, w, study.scored_tokens, stride,
                                study.eval_batch_tokens)
            rows.append({"method": method, "multiple": m, "length": w, "bits_per_char": bpc})
    return rows


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append rows, one JSON object a line (one write per call, so parallel parts interleave by line)."""
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def unique_runs(rows: list[dict]) -> list[dict]:
    """The first row of each (encoding, seed, method, multiple): parallel parts may repeat a run."""
    seen, out = set(), []
    for r in rows:
        key = (r["position"], r["seed"], r["method"], r["multiple"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


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
    done = {(r["position"], r["seed"]) for r in read_jsonl(out / "runs.jsonl")}
    steppers: dict = {}  # one compile per encoding, reused by every seed
    for seed in range(study.seeds):  # seed-major: every encoding gets seed 0 before any gets seed 1
        for position in study.position_list:
            if (position, seed) in done:
                continue
            cfg = model_cfg.replace(vocab_size=tok.vocab_size, max_len=study.train_len, position=position,
                                    scale_embeddings=model_cfg.scale_embeddings or (
                                        position == "sinusoidal" and study.sinusoidal_scale))
            if position not in steppers:
                stepper = Stepper(GPT(cfg), gpt_loss, train_cfg)
                steppers[position] = (stepper, jax.jit(lambda params, x, stepper=stepper: stepper.model(params)(x)))
            stepper, logits_jit = steppers[position]
            t0 = time.time()
            batch_fn = lm_batches(train_ids, study.train_len, train_cfg.batch_size, seed)
            state, summary = fit(stepper, stepper.init_state(init_params(GPT, cfg, seed)),
                                 map(batch_fn, itertools.count()), key=jax.random.key(seed))
            t_train = time.time() - t0
            rows = evaluate_model(lambda x: logits_jit(state.params, x), cfg, held_ids, study)
            t_eval = time.time() - t0 - t_train
            rows = [{"position": position, "seed": seed, **r} for r in rows]
            rows.append({"position": position, "seed": seed, "method": "train_loss_nats", "multiple": None,
                         "length": study.train_len, "bits_per_char": summary["train_loss"],
                         "train_s": round(t_train, 1), "eval_s": round(t_eval, 1)})
            append_jsonl(out / "runs.jsonl", rows)
            shown = " ".join(f"{r['length']}:{'n/a' if r['bits_per_char'] is None else round(r['bits_per_char'], 3)}"
                             for r in rows if r["method"] == "sliding")
            log(f"{position:>10} seed {seed}: train loss {summary['train_loss']:.3f} nats, train {t_train:.0f}s, "
                f"eval {t_eval:.0f}s; sliding bits/char {shown}")
    meta = {"corpus": corpus, "vocab_size": tok.vocab_size, "train_chars": int(len(train_ids)),
            "heldout_chars": int(len(held_ids)), "scored_chars": study.scored_tokens,
            "sliding_stride": study.sliding_stride,
            **run_metadata({"model": model_cfg, "train": train_cfg, "study": study}, started, revision)}
    append_jsonl(out / "parts.jsonl", [meta])
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl")), "parts": read_jsonl(out / "parts.jsonl"), **meta}
    write_results(result, study)
    log(f"wrote {study.out_dir} in {meta['wall_s']:.0f}s (load average {meta['load_average_at_end']})")
    return result


def rebuild_tables(out_dir: str | Path) -> dict:
    """Rewrite results.json, the tables and the plot from out_dir/runs.jsonl without training
    (for a study stopped part-way, or split across processes)."""
    out = Path(out_dir)
    parts = read_jsonl(out / "parts.jsonl")
    result = {"runs": unique_runs(read_jsonl(out / "runs.jsonl")), "parts": parts,
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
    positions = [p for p in POSITIONS if p in present]
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
