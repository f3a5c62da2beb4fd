"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers") at the scale of their `experiments/example.py`: an encoder
(5 layers, D 64, 8 heads, post-norm, ReLU, dropout 0.1) trained on inputs of length 1..40 and
scored per output token on longer inputs, each encoding with and without random positions.

As there, one input length is drawn per step (uniform over 1..train_max) and the model reads
the input followed by one BLANK per output token; its outputs at the BLANKs are the answer
(`make_model_with_empty_targets`; the tasks and rows: `txjax.studies.randomized_tasks`). Random
positions are a sorted random subset of [0, max_position) drawn in training and evaluation
alike, as their code does. Other forms follow their code more closely (`random_positions_form`):
"layer_distances", its ALiBi (positions stay 0..T-1 and each attention layer draws a sorted random
distance per offset, `ops.random_distances`; "distances" draws once for all layers; both here also
for T5's bias and KERPLE, which their code does not have), and "layers", its RoPE (each attention
layer draws its own positions).

Unlike their code, every batch is padded (so XLA compiles one step per padded width, not one per
length) with the pads masked and each row's random positions drawn as if unpadded
(`txjax.ops.random_positions` with lengths): to the task's widest training row, or, with
`train_width_multiple` k, to the next multiple of k: the same logits up to float rounding on fewer
pads (dropout's masks, drawn per padded shape, differ). Positions are drawn per row unless
`random_positions_per_batch` (their code: one set per batch); the loss is the mean over output
tokens, not their sum per sequence.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from txjax import Bert
from txjax.config import ABSOLUTE_POSITIONS, DIRECTIONAL_POSITIONS, RANDOM_POSITION_FORMS, BertConfig, positions_for
from txjax.data import IGNORE_INDEX
from txjax.nn.random_positions import RandomDraw
from txjax.studies.common import (
    append_jsonl,
    bias_learned,
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
from txjax.studies.randomized_tasks import PAD, TASKS, VOCAB_SIZE, encode, sample_task, width
from txjax.train.config import TrainConfig
from txjax.train.loop import fit
from txjax.train.steps import Stepper, bert_loss, fresh_rngs

RANDOM_SUFFIX = "+random"
THEIR_FORMS = {"alibi": "layer_distances", "rope": "layers"}  # their code's randomized ALiBi and RoPE; the rest draw positions


@dataclasses.dataclass(frozen=True)
class RandomizedConfig:
    """Tasks, lengths, the model (the paper's example.py by default), and what is compared."""

    tasks: str = ",".join(TASKS)  # comma list from TASKS
    positions: str = "sinusoidal,learned,rope,t5,alibi,none"  # encodings; each also with random positions, except none
    seeds: int = 3  # seeds per (task, encoding, randomized or not)
    train_max: int = 40  # training lengths 1..train_max, one drawn per step
    test_max: int = 100  # test lengths train_max+1 .. test_max (the paper: 500)
    test_step: int = 5  # every test_step-th test length is scored, the last always
    eval_examples: int = 64  # examples per scored length
    max_position: int = 2048  # random positions are drawn from [0, max_position) (the paper's noise_max_length)
    d_model: int = 64
    num_heads: int = 8
    num_layers: int = 5
    d_ff: int = 256
    dropout: float = 0.1
    dtype: str = "float32"  # of the matmuls and activations (BertConfig.dtype); bfloat16 runs them on the CPU's matrix units
    learned_init_std: float = 1.0  # learned tables: their code's hk.Embed default (truncated normal, std 1); ours is normal
    train_width_multiple: int = 0  # training rows padded to the next multiple of this (0: all to the widest training row)
    directional_bias: bool = False  # ALiBi / FIRE / KERPLE tell keys before the query from keys after it (BertConfig.directional_bias; their code's ALiBi does)
    random_positions_form: str = "positions"  # BertConfig.random_positions_form for every encoding: "positions", "distances" (a random distance per offset: ALiBi, T5's bias, KERPLE), "layer_distances" (the same, drawn per attention layer) or "layers" (positions drawn per attention layer); or "theirs": each encoding in their code's form (THEIR_FORMS)
    fire_threshold: float = BertConfig.fire_threshold  # FIRE's initial threshold L of its normaliser psi(max(L, i, j))
    fire_learn_threshold: bool = BertConfig.fire_learn_threshold  # FIRE learns L (their code); False: L stays fire_threshold
    fire_c: float = BertConfig.fire_c  # FIRE's initial scale c of psi(x) = log(c x + 1)
    fire_learn_c: bool = BertConfig.fire_learn_c  # FIRE learns c (their code); False: c stays fire_c
    fire_mlp_width: int = BertConfig.fire_mlp_width  # FIRE's hidden width (their code: 32); 0: f linear, one weight per head
    t5_num_buckets: int = BertConfig.num_buckets  # T5's buckets: a quarter exact per direction (offsets 0 .. n/4 - 1), then logarithmic
    t5_max_distance: int = BertConfig.max_distance  # T5: offsets beyond this share the last bucket
    kerple_r2_init_scale: float = BertConfig.kerple_r2_init_scale  # KERPLE's initial r2 (the reference code's draw) times this
    kerple_learn_r2: bool = BertConfig.kerple_learn_r2  # KERPLE learns r2 (their code); False: r2 stays its initial draw
    kerple_positive: str = BertConfig.kerple_positive  # KERPLE's r1, r2 kept positive by softplus (ours) or clamped (their code)
    random_positions_per_batch: bool = BertConfig.random_positions_per_batch  # one draw shared by a batch's rows, as their code (training and evaluation)
    stretch_test_positions: bool = False  # a cause-test, not the paper's protocol: longer test rows draw from a range grown with the row (eval_max_position)
    out_dir: str = "docs/results/randomized_positions"  # tables, plot, results.json, runs.jsonl

    def __post_init__(self):
        for name, allowed in (("tasks", TASKS), ("positions", positions_for("bert"))):
            items = parse_list(getattr(self, name))
            if not items or any(x not in allowed for x in items):
                raise ValueError(f"{name} must be a comma list from {allowed}, got {getattr(self, name)!r}")
        if not 1 <= self.train_max < self.test_max or self.test_step < 1:
            raise ValueError("need 1 <= train_max < test_max and test_step >= 1")
        if self.seeds < 1 or self.eval_examples < 1 or self.train_width_multiple < 0:
            raise ValueError("seeds >= 1, eval_examples >= 1 and train_width_multiple >= 0 are required")
        check_dtype(self.dtype)
        absolute = [p for p in parse_list(self.positions) if p in ABSOLUTE_POSITIONS]
        if self.stretch_test_positions and absolute:
            raise ValueError(f"stretch_test_positions would place {absolute} beyond every trained position; "
                             "it is for encodings that act in attention")
        if self.directional_bias and set(parse_list(self.positions)) - set(DIRECTIONAL_POSITIONS):
            raise ValueError(f"directional_bias is for {DIRECTIONAL_POSITIONS}, got positions={self.positions!r}")
        if self.random_positions_form != "theirs":  # "theirs" picks a form each encoding takes
            applies = RANDOM_POSITION_FORMS.get(self.random_positions_form, ((),))[0]
            if not set(parse_list(self.positions)) <= set(applies):
                raise ValueError(f"random_positions_form={self.random_positions_form!r} is for positions in "
                                 f"{applies}, got {self.positions!r}")
        widest = max(width(t, self.test_max) for t in parse_list(self.tasks))
        if self.max_position < widest:
            raise ValueError(f"max_position={self.max_position} is below the widest test row ({widest} tokens)")

    @property
    def test_lengths(self) -> tuple[int, ...]:
        lengths = list(range(self.train_max + 1, self.test_max + 1, self.test_step))
        return tuple(lengths if lengths[-1] == self.test_max else [*lengths, self.test_max])

    @property
    def variants(self) -> tuple[str, ...]:
        """'rope', 'rope+random', ...: each encoding plain, then randomized (not 'none')."""
        out = []
        for p in parse_list(self.positions):
            out += [p] if p == "none" else [p, p + RANDOM_SUFFIX]
        return tuple(out)


def train_width(task: str, length: int, study: RandomizedConfig) -> int:
    """The padded width of a training batch of `length`-token inputs: the task's widest training
    row, or the next multiple of `train_width_multiple` up to it (one compile per width used)."""
    widest, k = width(task, study.train_max), study.train_width_multiple
    return min(widest, -(-width(task, length) // k) * k) if k else widest


def eval_max_position(task: str, n: int, study: RandomizedConfig) -> int:
    """The range [0, this) a randomized model's length-n rows draw positions from: max_position, or,
    with `stretch_test_positions` and n beyond training, max_position grown in proportion to the
    row's width over the widest training row's. A test row's mean gap between positions then stays
    that of the widest training row instead of shrinking below every training row's."""
    if not study.stretch_test_positions or n <= study.train_max:
        return study.max_position
    return -(-study.max_position * width(task, n) // width(task, study.train_max))


def model_config(variant: str, task: str, study: RandomizedConfig) -> BertConfig:
    """The encoder of a variant; a plain learned table holds the task's widest training row."""
    position, randomized = variant.removesuffix(RANDOM_SUFFIX), variant.endswith(RANDOM_SUFFIX)
    plain_table = position == "learned" and not randomized
    return BertConfig(
        vocab_size=VOCAB_SIZE, max_len=width(task, study.train_max) if plain_table else study.max_position,
        d_model=study.d_model, num_heads=study.num_heads, num_layers=study.num_layers, d_ff=study.d_ff,
        activation="relu", dropout=study.dropout, dtype=study.dtype, position=position, embedding_norm=False,
        position_init_std=study.learned_init_std, directional_bias=study.directional_bias,
        scale_embeddings=True, type_vocab_size=1, pad_id=PAD,
        random_positions=study.max_position if randomized else None, random_positions_eval=randomized,
        random_positions_per_batch=study.random_positions_per_batch,
        fire_threshold=study.fire_threshold, fire_learn_threshold=study.fire_learn_threshold,
        fire_c=study.fire_c, fire_learn_c=study.fire_learn_c, fire_mlp_width=study.fire_mlp_width,
        kerple_r2_init_scale=study.kerple_r2_init_scale, kerple_positive=study.kerple_positive,
        kerple_learn_r2=study.kerple_learn_r2, num_buckets=study.t5_num_buckets, max_distance=study.t5_max_distance,
        random_positions_form=(THEIR_FORMS.get(position, "positions") if study.random_positions_form == "theirs"
                               else study.random_positions_form))


def eval_logits(stepper: Stepper, params, inputs_BT: jax.Array, key: jax.Array, max_position: int) -> jax.Array:
    """The evaluation model's logits. A randomized model draws its positions (or distances) here
    too, from [0, max_position), with a fresh key per call (the RNG state built inside)."""
    model = nnx.merge(stepper.eval_graphdef, params, fresh_rngs(stepper.rest, key))
    for _, module in nnx.iter_graph(model):
        if isinstance(module, RandomDraw):
            module.max_position = max_position
    return model(inputs_BT)


def token_accuracy(logits_fn, params, batch: dict[str, np.ndarray], key: jax.Array) -> float:
    """Mean over examples of the share of output tokens predicted right (argmax)."""
    pred = np.argmax(np.asarray(logits_fn(params, batch["inputs"], key)), axis=-1)
    scored = batch["targets"] != IGNORE_INDEX
    right = ((pred == batch["targets"]) & scored).sum(-1) / scored.sum(-1)
    return float(right.mean())


def run_one(task: str, variant: str, seed: int, study: RandomizedConfig, train_cfg: TrainConfig,
            cache: dict) -> dict:
    """Train one encoder on one task; its per-token accuracy at every scored length."""
    cfg = model_config(variant, task, study)
    if cfg not in cache:  # one model per config; XLA compiles once per row width (and stretched range)
        stepper = Stepper(Bert(cfg), bert_loss, train_cfg)
        cache[cfg] = (stepper, jax.jit(functools.partial(eval_logits, stepper), static_argnames="max_position"))
    stepper, logits_fn = cache[cfg]

    def batch_fn(step):
        rng = np.random.default_rng([seed, step, TASKS.index(task)])
        length = int(rng.integers(1, study.train_max + 1))
        return encode(*sample_task(task, rng, train_cfg.batch_size, length), train_width(task, length, study))

    t0 = time.time()
    state, summary = fit(stepper, stepper.init_state(init_params(Bert, cfg, seed)),
                         map(batch_fn, itertools.count()), key=jax.random.key(seed))
    t_train = time.time() - t0
    learned = bias_learned(stepper.model(state.params))
    # The same examples for every variant and seed; one padded width per split.
    scored = [(n, width(task, study.train_max)) for n in range(1, study.train_max + 1)]
    scored += [(n, width(task, study.test_max)) for n in study.test_lengths]
    accuracy = {}
    for n, row_width in scored:
        if cfg.random_positions is None and row_width > cfg.max_len:
            accuracy[n] = None  # a learned table cannot place these positions: n/a, never clamped
            continue
        rng = np.random.default_rng([10_000, TASKS.index(task), n])
        accuracy[n] = token_accuracy(
            functools.partial(logits_fn, max_position=eval_max_position(task, n, study)), state.params,
            encode(*sample_task(task, rng, study.eval_examples, n), row_width), jax.random.key(10_000 + n))
    inside = [accuracy[n] for n in range(1, study.train_max + 1)]
    outside = [accuracy[n] for n in study.test_lengths]
    return {"task": task, "variant": variant, "seed": seed, "train_loss": summary["train_loss"],
            "in_accuracy": float(np.mean(inside)),
            "out_accuracy": None if None in outside else float(np.mean(outside)),
            "accuracy_by_length": {str(n): a for n, a in accuracy.items()}, **learned,
            "train_s": round(t_train, 1), "eval_s": round(time.time() - t0 - t_train, 1)}


RUN_KEY = ("task", "variant", "seed")


def run_study(train_cfg: TrainConfig, study: RandomizedConfig, log=print) -> dict:
    """Every (task, variant, seed) not yet in out_dir/runs.jsonl, seed-major; then the tables.

    Each finished run is appended to runs.jsonl at once, so a stopped study resumes and a study
    can be split across processes by --tasks or --positions."""
    started, revision = time.time(), git_revision()
    out = Path(study.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = done_runs(out / "runs.jsonl", RUN_KEY)
    cache: dict = {}
    for seed in range(study.seeds):
        for task in parse_list(study.tasks):
            for variant in study.variants:
                if (task, variant, seed) in done:
                    continue
                r = run_one(task, variant, seed, study, train_cfg, cache)
                append_jsonl(out / "runs.jsonl", [r])
                log(f"{task:>18} {variant:>18} seed {seed}: loss {r['train_loss']:.3f} "
                    f"({r['train_s']:.0f}+{r['eval_s']:.0f}s) accuracy in {_pct(r['in_accuracy'])} "
                    f"out {_pct(r['out_accuracy'])}")
    meta = run_metadata({"train": train_cfg, "study": study}, started, revision)
    append_jsonl(out / "parts.jsonl", [meta])
    runs = unique_runs(read_jsonl(out / "runs.jsonl"), RUN_KEY)
    result = {"runs": runs, "parts": read_jsonl(out / "parts.jsonl"), **meta}
    write_results(result, study)
    log(f"wrote {study.out_dir} in {meta['wall_s']:.0f}s (load average {meta['load_average_at_end']})")
    return result


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def by_variant(runs: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(task, variant, its runs: one per seed) in the order the runs first name them."""
    keys = dict.fromkeys((r["task"], r["variant"]) for r in runs)
    return [(task, variant, [r for r in runs if (r["task"], r["variant"]) == (task, variant)])
            for task, variant in keys]


def summarize(runs: list[dict]) -> list[dict]:
    """Mean ± std over seeds per (task, variant), and the gain of randomizing each encoding."""
    rows = []
    for task, variant, rs in by_variant(runs):
        row = {"task": task, "variant": variant, "n_seeds": len(rs)}
        for split in ("in", "out"):
            row[f"{split}_mean"], row[f"{split}_std"], _ = mean_std([r[f"{split}_accuracy"] for r in rs])
        rows.append(row)
    return rows


def randomization_gains(summary: list[dict]) -> list[float]:
    """Out-of-distribution accuracy of each randomized encoding minus its plain form, per task
    (plain learned tables score n/a there and give no gain): the paper's 'average gain'."""
    by = {(r["task"], r["variant"]): r["out_mean"] for r in summary}
    return [by[(t, v)] - by[(t, v.removesuffix(RANDOM_SUFFIX))] for t, v in by
            if v.endswith(RANDOM_SUFFIX) and by[(t, v)] is not None
            and by.get((t, v.removesuffix(RANDOM_SUFFIX))) is not None]


def length_bands(study: RandomizedConfig) -> list[tuple[int, int]]:
    """Input-length bands for the per-band table: four inside training (1-10 ... 31-40 by default),
    three beyond it (41-60, 61-80, 81-100)."""
    def split(lo, hi, parts):
        width = -(-(hi - lo + 1) // parts)
        return [(a, min(a + width - 1, hi)) for a in range(lo, hi + 1, width)]
    return split(1, study.train_max, 4) + split(study.train_max + 1, study.test_max, 3)


def band_markdown(runs: list[dict], study: RandomizedConfig) -> str:
    """Per-token accuracy per length band: the mean over a run's scored lengths in the band, then
    over seeds (lengths a plain learned table cannot read are left out; n/a if none is left)."""
    def band_mean(run, lo, hi):
        values = [a for n, a in run["accuracy_by_length"].items() if lo <= int(n) <= hi and a is not None]
        return np.mean(values) if values else None

    bands = length_bands(study)
    rows = []
    for task, variant, rs in by_variant(runs):
        cells = [task, variant]
        for lo, hi in bands:
            per_run = [m for m in (band_mean(r, lo, hi) for r in rs) if m is not None]
            cells.append(f"{100 * np.mean(per_run):.1f}" if per_run else "n/a")
        rows.append(cells)
    header = ["task", "encoding"] + [f"{lo}–{hi}" for lo, hi in bands]
    return "### Per-token accuracy (%) by input length, mean over seeds\n\n" + markdown_table(header, rows)


def markdown(summary: list[dict], study: RandomizedConfig) -> str:
    def cell(row, split):
        m, s = row[f"{split}_mean"], row[f"{split}_std"]
        if m is None:
            return "n/a"
        return f"{100 * m:.1f}" + (f" ± {100 * s:.1f}" if row["n_seeds"] > 1 else "")

    tasks = list(dict.fromkeys(r["task"] for r in summary))
    header = ["encoding", "seeds"] + [f"{t} {s}" for t in tasks for s in (
        f"in (1–{study.train_max})", f"out ({study.train_max + 1}–{study.test_max})")]
    rows = []
    for v in dict.fromkeys(r["variant"] for r in summary):
        found = {r["task"]: r for r in summary if r["variant"] == v}
        cells = [v, "/".join(str(found[t]["n_seeds"]) if t in found else "0" for t in tasks)]
        for t in tasks:
            cells += [cell(found[t], s) if t in found else "–" for s in ("in", "out")]
        rows.append(cells)
    gains = randomization_gains(summary)
    tail = (f"\nRandom positions minus the plain encoding, out of distribution, averaged over "
            f"{len(gains)} (task, encoding) pairs: **{100 * np.mean(gains):+.1f} points** "
            f"(range {100 * min(gains):+.1f} to {100 * max(gains):+.1f}).\n") if gains else ""
    return "### Per-token accuracy (%), mean ± std over seeds\n\n" + markdown_table(header, rows) + tail


def write_results(result: dict, study: RandomizedConfig) -> Path:
    summary = summarize(result["runs"])
    out = write_outputs(study.out_dir, result, summary, [
        {k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in result["runs"]],
        markdown(summary, study) + "\n" + band_markdown(result["runs"], study))
    plot(result["runs"], study, out / "randomized_positions.png")
    return out


def plot(runs: list[dict], study: RandomizedConfig, path: Path) -> Path:
    """Per-token accuracy against input length, one panel per task, seeds averaged."""
    plt = pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), sharey=True, squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(dict.fromkeys(r["variant"].removesuffix(RANDOM_SUFFIX) for r in runs))}
    groups = by_variant(runs)
    for ax, task in zip(axes[0], tasks):
        for variant, rs in ((v, rs) for t, v, rs in groups if t == task):
            lengths = sorted(int(n) for n in rs[0]["accuracy_by_length"])
            acc = [np.mean([r["accuracy_by_length"][str(n)] if r["accuracy_by_length"][str(n)] is not None
                            else np.nan for r in rs]) for n in lengths]
            ax.plot(lengths, 100 * np.asarray(acc), color=colors[variant.removesuffix(RANDOM_SUFFIX)],
                    ls="-" if variant.endswith(RANDOM_SUFFIX) or variant == "none" else "--",
                    label=variant, lw=1.2)
        ax.axvline(study.train_max + 0.5, color="gray", lw=0.8)
        ax.set_title(task)
        ax.set_xlabel("input length")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("per-token accuracy (%)")
    max(axes[0], key=lambda ax: len(ax.get_lines())).legend(fontsize=6)  # the panel with every variant
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
