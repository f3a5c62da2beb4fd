"""The binarized-MNIST GPT experiment: data, baseline, test NLL, samples, the whole run.

Images are binarized and cut into 2×2 patches (`txjax.data.PatchTokenizer`): 196 patch
ids in 0..15 after a BOS id 16, 197 tokens. The model reads tokens 0..195 and predicts
tokens 1..196, the 196 patches. A test image's NLL is the sum of its 196 token NLLs in
nats; bits per pixel divide that by ln 2 and by 784 pixels.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.config import ExecutionConfig, GPTConfig
from txjax.data import BatchIterator, PatchTokenizer, ar_shift, load_mnist
from txjax.decoding import check_sampling, generate
from txjax.models import GPT
from txjax.ops import token_nll
from txjax.tasks.digits import CONFIDENT, accuracy, cached_classifier, digit_quality
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.loop import prepare_run_dir, write_json
from txjax.train.multihost import addressable, is_lead
from txjax.train.plots import plot_loss_curve, save_image_grid
from txjax.train.sharding import process_shard
from txjax.train.steps import Stepper, gpt_loss

PIXELS = 784


@dataclasses.dataclass(frozen=True)
class MnistRunConfig(RunConfig):
    """The MNIST run: data, tokenizer, evaluation and sampling."""

    name: str = "gpt_mnist"  # run folder name: <runs_dir>/<name>
    data: str | None = None  # MNIST .npz or folder; None: txjax.data.load_mnist's search ($TXJAX_DATA, the cache, ...); the script passes ../shared/data/mnist.npz when it is beside the repo
    patch: int = 2  # patch side in pixels; vocabulary 2**(patch*patch) + 1 (BOS)
    threshold: float = 0.5  # a pixel is on when it exceeds threshold * 255
    train_images: int = 0  # use the first N training images; 0: all 60,000
    test_images: int = 0  # score the first N test images; 0: all 10,000
    eval_batch_size: int = 500  # images per batch when scoring the test set
    temperature: float = 1.0  # sampling temperature for samples.png; 0 means greedy
    num_samples: int = 64  # digits drawn into samples.png
    top_k: int | None = None  # sample only among the k most likely patches; None: all
    quality_samples: int = 1000  # digits drawn and labelled by txjax.tasks.digits' classifier for summary.json; 0: skip

    def __post_init__(self):
        super().__post_init__()
        for name in ("eval_batch_size", "num_samples", "patch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("train_images", "test_images", "quality_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_sampling(self.temperature, self.top_k, None)


@dataclasses.dataclass(frozen=True)
class MnistTokens:
    """The run's images as tokens [N, 197] (BOS first), their labels, and where they came from."""

    tok: PatchTokenizer
    train_BT: np.ndarray
    test_BT: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray
    source: str


def load_tokens(run_cfg: MnistRunConfig) -> MnistTokens:
    data = load_mnist(run_cfg.data)
    tok = PatchTokenizer(patch=run_cfg.patch, threshold=run_cfg.threshold)
    train, test = slice(run_cfg.train_images or None), slice(run_cfg.test_images or None)
    return MnistTokens(tok, tok.encode(data.x_train[train]), tok.encode(data.x_test[test]),
                       data.y_train[train], data.y_test[test], data.source)


def shifted(tokens_BT: np.ndarray, rng=None) -> dict[str, np.ndarray]:
    """A GPT batch: inputs tokens[:, :-1] (BOS first), targets tokens[:, 1:] (the patches)."""
    inputs_BT, targets_BT = ar_shift(tokens_BT)
    return {"inputs": inputs_BT.astype(np.int32), "targets": targets_BT}


def unigram_baseline(train_BT: np.ndarray, test_BT: np.ndarray, num_ids: int, alpha: float = 1.0) -> float:
    """Mean test NLL (nats per image) of independent per-position patch distributions.

    For each of the patch positions, p(id) = (count + alpha) / (N + alpha * num_ids) from
    the training tokens (alpha = 1: add-one / Laplace smoothing), so no test id gets
    probability 0. BOS (column 0) is excluded: it is given, not predicted.
    """
    train, test = train_BT[:, 1:], test_BT[:, 1:]
    positions = train.shape[1]
    counts_PV = np.zeros((positions, num_ids), np.float64)
    for v in range(num_ids):
        counts_PV[:, v] = (train == v).sum(axis=0)
    logp_PV = np.log(counts_PV + alpha) - np.log(train.shape[0] + alpha * num_ids)
    nll = -logp_PV[np.arange(positions)[None, :], test]
    return float(nll.sum(axis=1).mean())


def image_nll(stepper: Stepper, params, tokens_BT: np.ndarray, batch_size: int) -> np.ndarray:
    """Per-image NLL in nats (sum over the predicted patches), float64 [N]."""

    @jax.jit
    def per_image(params, inputs_BT, targets_BT):
        nll_BT, _ = token_nll(stepper.model(params)(inputs_BT), targets_BT)
        return jnp.sum(nll_BT, axis=1)

    n = tokens_BT.shape[0]
    out = []
    for start in range(0, n, batch_size):
        chunk = tokens_BT[start: start + batch_size]
        real = chunk.shape[0]
        if real < batch_size:  # pad to the compiled shape; padded rows are dropped
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, axis=0)])
        b = shifted(chunk)
        out.append(np.asarray(per_image(params, b["inputs"], b["targets"]), np.float64)[:real])
    return np.concatenate(out)


def nats_to_bits_per_pixel(nats_per_image: float) -> float:
    return nats_per_image / math.log(2) / PIXELS


def sample_patches(model, tok: PatchTokenizer, n: int, key, temperature: float = 1.0,
                   top_k: int | None = None, batch_size: int = 250) -> np.ndarray:
    """n sampled images as patch ids [n, 196], drawn batch_size at a time (bounded KV-cache memory).

    A trained model almost never emits BOS mid-image; if it does, that patch is left blank (0).
    """
    out = []
    for i, start in enumerate(range(0, n, batch_size)):
        prompt_BT = np.full((min(batch_size, n - start), 1), tok.bos_id, np.int32)
        tokens_BT = np.asarray(generate(model, prompt_BT, tok.seq_len - 1, jax.random.fold_in(key, i),
                                        temperature=temperature, top_k=top_k))
        out.append(tokens_BT[:, -(tok.seq_len - 1):])
    patches = np.concatenate(out)
    return np.where(patches >= tok.bos_id, 0, patches).astype(np.int32)


def save_samples(path, tok: PatchTokenizer, patches_NT: np.ndarray) -> None:
    """Sampled digits as .npz: images uint8 [N, 28, 28] (0 or 255) and tokens int32 [N, 197], BOS first."""
    tokens = np.concatenate([np.full((len(patches_NT), 1), tok.bos_id, np.int32), patches_NT], axis=1)
    np.savez_compressed(path, images=tok.decode(patches_NT, dtype=np.uint8), tokens=tokens)


def sample_quality(data: MnistTokens, patches_NT: np.ndarray, log=print) -> dict:
    """The digit classifier's view of samples beside as many real test digits (txjax.tasks.digits)."""
    tok = data.tok
    params, path = cached_classifier(tok.decode(data.train_BT) > 0, data.y_train, log=log)
    test_bits = tok.decode(data.test_BT) > 0
    acc = accuracy(params, test_bits, data.y_test)
    samples = digit_quality(params, tok.decode(patches_NT) > 0)
    real = digit_quality(params, test_bits[: len(patches_NT)])
    log(f"digit classifier ({path.name}): {acc:.4f} on {len(test_bits)} binarized test images; "
        f"p >= {CONFIDENT} for {samples['confident_share']:.3f} of {samples['n']} samples "
        f"({samples['classes']} classes) vs {real['confident_share']:.3f} of {real['n']} real digits "
        f"({real['classes']} classes)")
    return {"classifier_test_accuracy": acc, "classifier_confidence": CONFIDENT,
            "samples_confident_share": samples["confident_share"], "samples_classes": samples["classes"],
            "real_confident_share": real["confident_share"], "real_classes": real["classes"],
            "samples_confident_ratio": samples["confident_share"] / max(real["confident_share"], 1e-9),
            "quality_samples": samples["n"]}


def run_gpt_mnist(model_cfg: GPTConfig, train_cfg: TrainConfig, run_cfg: MnistRunConfig,
                  *, execution: ExecutionConfig | None = None, stop_at: int | None = None, log=print) -> dict:
    """Train (or resume) a GPT on binarized MNIST, then score the test set and draw samples.

    Writes config.json, metrics.jsonl, checkpoints/, loss.png, samples.png and
    summary.json into run_cfg.run_dir; returns the summary.
    """
    prepare_run_dir(run_cfg.run_dir)  # fail before loading data; emptied (overwrite) only once claimed
    t0 = time.perf_counter()
    data = load_tokens(run_cfg)
    tok, train_BT, test_BT = data.tok, data.train_BT, data.test_BT
    if model_cfg.vocab_size != tok.vocab_size:
        raise ValueError(f"vocab_size={model_cfg.vocab_size} but {run_cfg.patch}x{run_cfg.patch} patches "
                         f"need {tok.vocab_size} (patch ids and BOS)")
    if model_cfg.position == "learned" and model_cfg.max_len < tok.seq_len - 1:
        raise ValueError(f"max_len={model_cfg.max_len} is shorter than the {tok.seq_len - 1} input tokens")
    log(f"MNIST from {data.source}: {len(train_BT)} train / {len(test_BT)} test images, "
        f"{tok.seq_len} tokens each (BOS {tok.bos_id}, vocab {tok.vocab_size})")
    model = GPT(model_cfg, rngs=nnx.Rngs(train_cfg.seed), execution=execution)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    log(f"GPT: {n_params:,} parameters, {model_cfg.num_layers} layers, d_model {model_cfg.d_model}")
    batches = BatchIterator(train_BT, train_cfg.batch_size, seed=train_cfg.seed, transform=shifted,
                            shard=process_shard())
    held_out = test_BT[: train_cfg.eval_batches * run_cfg.eval_batch_size]

    def eval_fn(stepper, params):
        b = run_cfg.eval_batch_size
        chunks = [shifted(held_out[i: i + b]) for i in range(0, len(held_out) - b + 1, b)]
        return stepper.evaluate(params, chunks or [shifted(held_out)])

    tokenizer_meta = {"tokenizer": {"kind": "patch", **dataclasses.asdict(tok)}}
    stepper, state, fit_summary = train_run(
        model, gpt_loss, train_cfg, run_cfg, batches, extra_meta=tokenizer_meta,
        eval_fn=eval_fn, stop_at=stop_at, log=log)
    return finish_gpt_mnist(stepper, addressable(stepper.eval_params(state)), data, run_cfg, fit_summary, t0, log)


def finish_gpt_mnist(stepper, params, data: MnistTokens, run_cfg, fit_summary, t0, log=print) -> dict:
    """Test NLL, samples and their quality from `params` (readable by this process); several
    processes each compute the same, on their own device, and process 0 writes the files."""
    run_dir, tok, train_BT, test_BT = run_cfg.run_dir, data.tok, data.train_BT, data.test_BT
    t_eval = time.perf_counter()
    nll = image_nll(stepper, params, test_BT, run_cfg.eval_batch_size)
    nats = float(nll.mean())
    baseline = unigram_baseline(train_BT, test_BT, tok.bos_id)
    eval_s = time.perf_counter() - t_eval
    t_sample = time.perf_counter()
    patches = sample_patches(stepper.model(params), tok, max(run_cfg.num_samples, run_cfg.quality_samples),
                             jax.random.key(stepper.cfg.seed + 7), run_cfg.temperature, run_cfg.top_k)
    sample_s = time.perf_counter() - t_sample
    quality = sample_quality(data, patches[: run_cfg.quality_samples], log) if run_cfg.quality_samples else {}
    if is_lead():
        save_samples(run_dir / "samples.npz", tok, patches)
        images = tok.decode(patches[: run_cfg.num_samples], dtype=np.float32)
        save_image_grid(images, run_dir / "samples.png",
                        title=f"{run_cfg.num_samples} samples, temperature {run_cfg.temperature}")
        plot_loss_curve(run_dir / "metrics.jsonl", run_dir / "loss.png")
    summary = {
        "test_images": int(len(test_BT)),
        "test_nll_nats_per_image": nats,
        "test_bits_per_pixel": nats_to_bits_per_pixel(nats),
        "unigram_baseline_nats_per_image": baseline,
        "unigram_baseline_bits_per_pixel": nats_to_bits_per_pixel(baseline),
        "unigram_smoothing": "add-one (Laplace) per position over the 16 patch ids",
        "steps": fit_summary["steps"],
        "train_loss": fit_summary["train_loss"],
        "train_ms_per_step": fit_summary["ms_per_step"],
        "train_tokens_per_s": fit_summary["tokens_per_s"],
        "train_wall_s": fit_summary["wall_s"],
        "test_eval_s": eval_s,
        "sampling_s": sample_s,
        "total_wall_s": time.perf_counter() - t0,
        "resumed_from": fit_summary["resumed_from"],
        "backend": jax.default_backend(),
        **quality,
    }
    if is_lead():
        write_json(run_dir / "summary.json", summary)
    log(f"test NLL {nats:.2f} nats/image = {summary['test_bits_per_pixel']:.4f} bits/pixel "
        f"over {len(test_BT)} test images; per-position unigram baseline {baseline:.2f} nats/image "
        f"= {summary['unigram_baseline_bits_per_pixel']:.4f} bits/pixel")
    log(f"wrote {run_dir}/samples.png, samples.npz, loss.png, metrics.jsonl, summary.json, checkpoints/")
    return summary
