"""Load a run's checkpoint and generate: MNIST digits (GPT), filled spans (T5) or masks (BERT)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
from flax import nnx

import txjax
from txjax.config import config_from_dict
from txjax.data import PatchTokenizer
from txjax.train.checkpoint import Checkpointer
from txjax.train.config import TrainConfig
from txjax.train.plots import save_image_grid
from txjax.train.steps import LOSSES, Stepper

MODELS = {"gpt": txjax.GPT, "bert": txjax.Bert, "t5": txjax.T5}


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """What to load and how to sample."""

    run: str = "runs/gpt_mnist_cpu"  # a run folder written by a train_*.py script
    step: int | None = None  # checkpoint step to load; None: the latest
    num_samples: int = 64  # GPT/MNIST: digits to draw
    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_k: int | None = None  # sample only among the k most likely tokens; None: all
    seed: int = 0  # sampling key
    out: str | None = None  # GPT/MNIST: PNG to write; None: <run>/samples_step<step>.png
    prompt: str = "To be, or not to b_, that is the qu_____n"  # BERT/T5: text whose "_" runs are masked spans

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")


def load_run(run_dir: str | Path, step: int | None = None):
    """(model with the checkpoint's parameters, checkpoint metadata, step)."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    checkpointer = Checkpointer(ckpt_dir, read_only=True)
    try:
        meta = checkpointer.read_meta(step)
        model_cfg = config_from_dict(meta["model"])
        train_cfg = TrainConfig(**meta["train"])
        model = MODELS[model_cfg.family](model_cfg, rngs=nnx.Rngs(0))
        stepper = Stepper(model, LOSSES[model_cfg.family], train_cfg)
        state, meta = checkpointer.restore(stepper.init_state(), meta["step"])
    finally:
        checkpointer.close()
    return stepper.model(state.params), meta, meta["step"]


def masked_prompt(text: str) -> list[tuple[str, int]]:
    """Split text into (chunk, masked-run length) pieces at runs of '_'."""
    return [(m.group(1), len(m.group(2))) for m in re.finditer(r"([^_]*)(_*)", text) if m.group(0)]


def sample_from_run(cfg: SampleConfig, log=print) -> dict:
    """Generate from the run named in cfg and report what was made."""
    model, meta, step = load_run(cfg.run, cfg.step)
    key = jax.random.key(cfg.seed)
    family = meta["model"]["family"]
    tok_meta = meta.get("tokenizer", {})
    if family == "gpt" and tok_meta.get("kind") == "patch":
        from txjax.train.mnist import sample_digits

        tok = PatchTokenizer(**{k: v for k, v in tok_meta.items() if k != "kind"})
        temperature = max(cfg.temperature, 1e-6)
        images = sample_digits(model, tok, cfg.num_samples, key, temperature, cfg.top_k)
        out = Path(cfg.out) if cfg.out else Path(cfg.run) / f"samples_step{step}.png"
        save_image_grid(images, out, title=f"step {step}, temperature {cfg.temperature}")
        log(f"wrote {cfg.num_samples} digits to {out}")
        return {"out": str(out), "step": step}
    from txjax.train.text import fill_masks, fill_spans, tokenizer_from_meta

    tok = tokenizer_from_meta(meta)
    if family == "bert":
        text = fill_masks(model, tok, cfg.prompt)
    elif family == "t5":
        text = fill_spans(model, tok, cfg.prompt, key, cfg.temperature, cfg.top_k)
    else:
        raise ValueError(f"no sampler for a {family} run with tokenizer {tok_meta.get('kind')!r}")
    log(f"prompt: {cfg.prompt!r}\nfilled: {text!r}")
    return {"prompt": cfg.prompt, "filled": text, "step": step}


__all__ = ["SampleConfig", "load_run", "masked_prompt", "sample_from_run"]
