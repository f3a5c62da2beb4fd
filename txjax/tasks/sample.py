"""Load a run's checkpoint and generate: MNIST digits (GPT), filled spans (T5) or masks (BERT)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from txjax.config import config_from_dict
from txjax.data import PatchTokenizer
from txjax.decoding import check_sampling
from txjax.models import MODELS
from txjax.tasks.mlm import fill_masks
from txjax.tasks.mnist import sample_patches, save_samples
from txjax.tasks.spans import fill_spans
from txjax.tasks.text import masked_prompt, tokenizer_from_meta
from txjax.train.checkpoint import Checkpointer
from txjax.train.config import TrainConfig
from txjax.train.optim import averaged_params, make_optimizer
from txjax.train.plots import save_image_grid
from txjax.train.steps import TrainState


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """What to load and how to sample."""

    run: str = "runs/gpt_mnist_cpu"  # a run folder written by a train_*.py script
    step: int | None = None  # checkpoint step to load; None: the latest
    num_samples: int = 64  # GPT/MNIST: digits to draw
    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_k: int | None = None  # sample only among the k most likely tokens; None: all
    seed: int = 0  # sampling key
    out: str | None = None  # GPT/MNIST: PNG to write (folders made), with the digits as .npz beside it; None: <run>/samples_step<step>.png
    prompt: str = "To be, or not to b_, that is the qu_____n"  # BERT/T5: text whose "_" runs are masked spans

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        check_sampling(self.temperature, self.top_k, None)


def load_run(run_dir: str | Path, step: int | None = None):
    """(model with the checkpoint's parameters, dropout off; checkpoint metadata; step).

    Only the parameters are read, or, for a run with `ema_decay`, their moving average (then the
    whole state is read: the average is kept in the optimizer state).
    """
    checkpointer = Checkpointer(Path(run_dir) / "checkpoints", read_only=True)
    try:
        meta = checkpointer.read_meta(step)
        model_cfg = config_from_dict(meta["model"])
        model = MODELS[model_cfg.family](model_cfg, rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(nnx.view(model, deterministic=True, raise_if_not_found=False),
                                           nnx.Param, ...)
        ema_decay = meta.get("train", {}).get("ema_decay", 0.0)
        if ema_decay:  # the moving average lives in the optimizer state: read it whole
            optimizer = make_optimizer(TrainConfig(**meta["train"]), params)
            like = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
            params = averaged_params(checkpointer.restore(like, meta["step"])[0].opt_state, ema_decay)
        else:
            params = checkpointer.restore_params(params, meta["step"])
    finally:
        checkpointer.close()
    return nnx.merge(graphdef, params, rest), meta, meta["step"]


def sample_from_run(cfg: SampleConfig, log=print) -> dict:
    """Generate from the run named in cfg and report what was made."""
    model, meta, step = load_run(cfg.run, cfg.step)
    key = jax.random.key(cfg.seed)
    family = meta["model"]["family"]
    tok_meta = meta.get("tokenizer", {})
    if family == "gpt" and tok_meta.get("kind") == "patch":
        tok = PatchTokenizer(**{k: v for k, v in tok_meta.items() if k != "kind"})
        patches = sample_patches(model, tok, cfg.num_samples, key, cfg.temperature, cfg.top_k)
        out = Path(cfg.out) if cfg.out else Path(cfg.run) / f"samples_step{step}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        save_image_grid(tok.decode(patches, dtype=np.float32), out,
                        title=f"step {step}, temperature {cfg.temperature}")
        save_samples(out.with_suffix(".npz"), tok, patches)
        log(f"wrote {cfg.num_samples} digits to {out} and {out.with_suffix('.npz')} (images uint8, tokens)")
        return {"out": str(out), "npz": str(out.with_suffix(".npz")), "step": step}
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
